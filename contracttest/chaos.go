package contracttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// ChaosConfig configures [RunChaos]. Zero fields take the defaults given.
type ChaosConfig struct {
	Duration   time.Duration // how long clients run; required ($LOCKS_CHAOS_DURATION or $CHAOS_DURATION overrides it)
	Clients    int           // clients working at once (6)
	Names      int           // names they contend for (3)
	MaxHold    time.Duration // the longest critical section (20ms)
	FaultEvery time.Duration // the mean time between two faults (1s)
	// Seed seeds the random choices (not the timing); $CHAOS_SEED
	// overrides it; 0 picks one at random.
	Seed uint64
	// Faults, when set, limits the faults injected to these kinds (among
	// those the harness supports); nil means every kind it supports.
	// $CHAOS_FAULTS overrides it.
	Faults []string
	// MaxOutage bounds how long a client's link stays faulted (lost or
	// late replies) and, unless the fault says otherwise, a broker fault
	// (the largest CrashRecovery of the run's clients).
	MaxOutage time.Duration
	// Guard, when set, routes the run's resource writes through a
	// fencing guard as well (a [GuardedStore] it makes once for the run,
	// on one key per name), for backends with fencing tokens: every write
	// of a holder, and also the writes a holder makes after its lease has
	// ended (it did not look in time) and the one a crashed holder had in
	// flight, which lands once a later holder has written. The check then
	// counts the stale writes that landed (a write the guard took after
	// it had taken one with a greater token: each is a violation) beside
	// the ones it refused, and checks that each name's data at the end
	// was written with the greatest token the guard took.
	Guard NewGuardedStore
}

// ChaosDurationEnv names the environment variable that overrides
// ChaosConfig.Duration, so that the same test runs for seconds in `mage
// test` and for minutes in `mage chaos` (which sets it, e.g. to "5m").
// When it is unset, $CHAOS_DURATION (what `mage chaos` reads) is used, so
// that `CHAOS_DURATION=30s go test -run '^TestChaos' ./...` works too.
const ChaosDurationEnv = "LOCKS_CHAOS_DURATION"

// ChaosSeedEnv names the environment variable that sets the seed of every
// [RunChaos] run, overriding ChaosConfig.Seed. Each run prints its seed
// when it starts, in its summary and when it fails; running it again with
// CHAOS_SEED set to that seed makes the same random choices: each client's
// options, each worker's names and holding times, the kinds, victims and
// lengths of the faults. The timing of the brokers and of the scheduler is
// not reproduced, so a seed makes a failure likely again, not certain.
const ChaosSeedEnv = "CHAOS_SEED"

// ChaosFaultsEnv names the environment variable that limits the faults
// of every [RunChaos] run to the kinds it lists, separated by commas
// (e.g. "crash,lost-replies"), overriding ChaosConfig.Faults: to find
// which fault a violation needs.
const ChaosFaultsEnv = "CHAOS_FAULTS"

// chaosDuration is $LOCKS_CHAOS_DURATION or $CHAOS_DURATION when set, else
// short.
func chaosDuration(t testing.TB, short time.Duration) time.Duration {
	env := ChaosDurationEnv
	v := os.Getenv(env)
	if v == "" {
		env = "CHAOS_DURATION"
		v = os.Getenv(env)
	}
	if v == "" {
		return short
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 5m", env, v)
	}
	return d
}

// chaosSeed is $CHAOS_SEED when set, else seed, else a random seed.
func chaosSeed(t testing.TB, seed uint64) uint64 {
	if v := os.Getenv(ChaosSeedEnv); v != "" {
		var s uint64
		if _, err := fmt.Sscan(v, &s); err != nil || s == 0 {
			t.Fatalf("%s=%q: want a positive integer, as a chaos run prints it", ChaosSeedEnv, v)
		}
		return s
	}
	if seed == 0 {
		seed = rand.Uint64()>>1 | 1
	}
	return seed
}

// Fault kinds injected by [RunChaos]. A [BrokerFaulter] adds kinds of its
// own.
const (
	FaultCrash   = "crash"   // Harness.Kill on a client, then a new client in its place
	FaultAbandon = "abandon" // a client's Lock cancelled while it waits
	FaultClose   = "close"   // a client closed (Client.Close), then a new one in its place
	// FaultLostReplies makes a client's [Link] drop what the broker sends
	// back for a while, then heals it: requests still run at the broker,
	// so a step of the protocol has an outcome its client never hears.
	// The client is armed, and its replies start being lost when it next
	// reaches the step drawn: its Lock (the acquire, and a takeover if it
	// waits), its critical section (the renewals), or its Release. The
	// summary counts them by step ("lost-replies@release"). Needs a
	// [ChaosHarness] whose clients have a Link.
	FaultLostReplies = "lost-replies"
	// FaultLateReplies makes a client's [Link] hold what the broker sends
	// back for a while before delivering it, for a while, then heals it:
	// replies arrive after their caller may have given up on them. Needs a
	// Link that is a [ReplyDelayer].
	FaultLateReplies = "late-replies"
)

// ChaosHarness is an optional interface that may be implemented by a
// [Harness] for [RunChaos]: NewChaosClient is NewClient with options of
// the client's own, drawn from rng within the ranges the backend accepts
// (TTLs, renewal intervals, drift, priorities, heartbeats...), so that the
// clients of one run differ as the processes of a real deployment do.
// RunChaos gives each client a rng of its own, seeded from the run's seed
// and the client's number, so that a seed reproduces the mix.
type ChaosHarness interface {
	NewChaosClient(ctx context.Context, rng *rand.Rand) (ChaosClient, error)
}

// ChaosClient is a client made by a [ChaosHarness], with what [RunChaos]
// needs to know of it.
type ChaosClient struct {
	Client

	// Options says which options were drawn, such as "ttl=450ms
	// drift=0.02 priority=1". The run logs it, and a violation lists the
	// options of every client it involves.
	Options string

	// CrashRecovery bounds how long after this client is killed another
	// client holds its names, whatever the options of the clients that
	// wait (the run checks it as the suite does, with a margin). Zero
	// means Capabilities().CrashRecovery.
	CrashRecovery time.Duration

	// Link, if not nil, is the client's network path to every broker it
	// uses, which the run faults ([FaultLostReplies], and
	// [FaultLateReplies] if it is a [ReplyDelayer]). It must stay usable
	// after Kill and Close (Restore on it is then harmless).
	Link Link
}

// ReplyDelayer is an optional interface that may be implemented by a
// [Link]: DelayReplies holds what the broker sends back for d before it
// delivers it, until Restore. *testenv.Proxy and testenv.Proxies
// implement it.
type ReplyDelayer interface {
	DelayReplies(d time.Duration)
}

// BrokerFaulter is an optional interface that may be implemented by a
// [Harness] for [RunChaos]: BrokerFaults returns the faults of the brokers
// themselves that the harness can inject (a minority of Redis masters
// refusing connections, a broker restarted), each of which the run
// injects now and then, one at a time, and heals after a while.
type BrokerFaulter interface {
	BrokerFaults() []BrokerFault
}

// BrokerFault is one kind of fault of the brokers; see [BrokerFaulter].
// Mutual exclusion and fencing must hold through it; the run's liveness
// checks allow for its outage (its length plus a recovery bound).
type BrokerFault struct {
	Kind string // as counted in the summary, e.g. "minority-refuses"

	// Inject starts the fault, choosing with rng whatever it needs (which
	// master), and returns the function that heals it. The run calls both
	// from the test's goroutine, and heals every fault before it ends.
	Inject func(ctx context.Context, rng *rand.Rand) (heal func() error, err error)

	// MinOutage and MaxOutage bound how long the run leaves the fault
	// before it heals it (a master restarted empty must stay down longer
	// than any TTL). Zero MaxOutage means ChaosConfig.MaxOutage.
	MinOutage, MaxOutage time.Duration

	// Goroutines lists prefixes of the functions of the goroutines a
	// broker started anew runs in the test's process (an embedded server,
	// the waiter of a server process: "github.com/nats-io/nats-server/"),
	// which the run's leak check then ignores: a goroutine with such a
	// function anywhere in its stack is the broker's, not the backend's.
	Goroutines []string
}

// ChaosSummary is what one [RunChaos] run observed.
type ChaosSummary struct {
	Seed         uint64
	Acquisitions int            // critical sections entered
	Faults       map[string]int // injected, by kind
	// FencedRejections counts writes a FencedResource refused: a holder
	// that wrote after its successor, stopped by its stale token. They are
	// the fence working, not violations.
	FencedRejections int
	// LeasesEnded counts sections cut short by their lease ending (lost)
	// before their holder left: the holder was told, and stopped.
	LeasesEnded int
	// EndedBeforeEntry counts leases that had ended (taken or expired)
	// by the time their holder entered its section: empty sections,
	// left out of the checks of sections (but not of the Locks' tokens).
	EndedBeforeEntry int
	Recoveries       int           // crashed holders whose names were taken again
	WorstRecovery    time.Duration // the longest of those hand-overs
	// LockErrors counts the Locks that failed, by kind of error: the
	// context's ("deadline", "cancelled"), "closed" (ErrClosed: the client
	// gave up its connection and was replaced), or the error's type.
	LockErrors map[string]int
	// Clients maps each client of the run to the options it was given
	// (empty without a [ChaosHarness]).
	Clients map[string]string
	// Linearizability is porcupine's verdict on the fencing tokens
	// (Ok, Illegal, or Unknown when it timed out); empty without fencing.
	Linearizability porcupine.CheckResult
	// GuardedWrites, GuardRefused and GuardErrors count the writes
	// through [ChaosConfig.Guard] it took, refused as stale, and that
	// failed otherwise (during a fault); LateWrites counts those made
	// with a lease that had ended or by a crashed holder. StaleLanded
	// counts the writes it took with a token below one it had taken
	// before: stale writes that landed, each a violation. All zero
	// without a Guard.
	GuardedWrites, GuardRefused, GuardErrors, LateWrites int
	StaleLanded                                          int
	Violations                                           []string
}

func (s ChaosSummary) String() string {
	lin := string(s.Linearizability)
	if lin == "" {
		lin = "n/a (no fencing tokens)"
	}
	guard := ""
	if s.GuardedWrites+s.GuardRefused+s.GuardErrors > 0 {
		guard = fmt.Sprintf("; through the guard: %d writes taken, %d refused as stale, %d failed, %d late, stale writes landed %d",
			s.GuardedWrites, s.GuardRefused, s.GuardErrors, s.LateWrites, s.StaleLanded)
	}
	return fmt.Sprintf("seed %d (%s=%d reproduces it): %d clients, %d acquisitions; faults: %s; failed Locks: %s; fenced rejections %d; leases ended while held %d, before entry %d; %d crashed holders replaced, worst after %v; tokens linearizable: %s%s; violations %d",
		s.Seed, ChaosSeedEnv, s.Seed, len(s.Clients), s.Acquisitions, counts(s.Faults), counts(s.LockErrors), s.FencedRejections, s.LeasesEnded, s.EndedBeforeEntry, s.Recoveries,
		s.WorstRecovery.Round(time.Millisecond), lin, guard, len(s.Violations))
}

// counts formats m as "a 1, b 2", sorted.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	kinds := make([]string, 0, len(m))
	for k, n := range m {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(kinds)
	return strings.Join(kinds, ", ")
}

// RunChaos runs cfg.Clients clients against the backend for cfg.Duration,
// each locking random names among cfg.Names and holding them for up to
// cfg.MaxHold, while faults are injected at random: a client crashed
// (Harness.Kill), a Lock abandoned by cancelling its context, a client
// closed; with a [ChaosHarness], clients with options of their own whose
// replies are lost or late for a while; with a [BrokerFaulter], faults of
// the brokers. Every critical section is recorded on one monotonic clock
// and checked at the end:
//   - no two sections on one name overlap (a crashed client's section ends
//     when it is killed: a dead process does nothing more);
//   - where the backend has fencing tokens, each holder of a name has a
//     greater token than the holder before it, the tokens are
//     linearizable as a strictly increasing counter per name (checked with
//     porcupine, and a Lock that began after another returned never gets
//     a token no greater than its), and every write goes through a
//     [FencedResource];
//   - with a [ChaosConfig.Guard], no stale write lands through the guard
//     (also the late writes of holders whose lease ended, and of crashed
//     holders), and each name's data ends with the greatest token the
//     guard took;
//   - every name held by a crashed client is held again within the
//     crashed client's CrashRecovery bound (as the conformance suite
//     allows it), plus the outages of faults overlapping the wait;
//   - no name stalls: none goes longer than twice the largest such bound
//     plus a second, plus those outages, without a holder while clients
//     want it;
//   - no goroutine outlives the run.
//
// A violation names the clients involved with their options. The run logs
// its seed when it starts, in its summary and when it fails ([ChaosSeedEnv]
// reproduces it). It fails t for every violation and returns the summary.
//
// Like the rest of the suite, it should not produce false positives, may
// produce false negatives (a run that sees no overlap proves nothing), and
// runs under -race.
func RunChaos(t *testing.T, nh NewHarness, cfg ChaosConfig) ChaosSummary {
	t.Helper()
	if cfg.Duration > 0 {
		cfg.Duration = chaosDuration(t, cfg.Duration)
	}
	r := newChaosRun(t, nh, cfg)
	defer r.close()
	r.run()
	s := r.check()
	for _, v := range s.Violations {
		t.Errorf("violation (seed %d): %s", s.Seed, v)
	}
	t.Logf("chaos summary: %v", s)
	return s
}
