package redlockprio_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// cmdGate holds, on one go-redis client, the commands it matches while
// it is armed, until it is opened (or the call's context ends), and
// says on seen when the first one comes.
type cmdGate struct {
	match    func(redis.Cmder) bool
	armed    atomic.Bool
	seenOnce sync.Once
	seen     chan struct{}
	openOnce sync.Once
	opened   chan struct{}
}

func newCmdGate(match func(redis.Cmder) bool) *cmdGate {
	return &cmdGate{match: match, seen: make(chan struct{}), opened: make(chan struct{})}
}

func (g *cmdGate) open() { g.openOnce.Do(func() { close(g.opened) }) }

func (g *cmdGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *cmdGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if g.armed.Load() && g.match(cmd) {
			g.seenOnce.Do(func() { close(g.seen) })
			select {
			case <-g.opened:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
}

func (g *cmdGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// scriptOf names the package's script that cmd runs (EVALSHA or EVAL),
// or "".
func scriptOf(cmd redis.Cmder) string {
	args := cmd.Args()
	if len(args) < 2 {
		return ""
	}
	s, _ := args[1].(string)
	switch strings.ToLower(cmd.Name()) {
	case "evalsha":
		return scriptNames[s]
	case "eval":
		d := sha1.Sum([]byte(s))
		return scriptNames[hex.EncodeToString(d[:])]
	}
	return ""
}

func runsScript(name string) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool { return scriptOf(cmd) == name }
}

// isTheftNotice matches the PUBLISH of a theft notice ("N|victim|...").
func isTheftNotice(cmd redis.Cmder) bool {
	args := cmd.Args()
	if !strings.EqualFold(cmd.Name(), "publish") || len(args) < 3 {
		return false
	}
	p, _ := args[2].(string)
	return strings.HasPrefix(p, "N|")
}

func waitSeen(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// holdings records, in order, who held a name with which token.
type holdings struct {
	t     *testing.T
	name  string
	mu    sync.Mutex
	order []holding
}

type holding struct {
	who   string
	token uint64
}

func (h *holdings) add(who string, l locks.Lease) {
	h.mu.Lock()
	h.order = append(h.order, holding{who, l.Token()})
	h.mu.Unlock()
	h.t.Logf("%s holds %q with token %d", who, h.name, l.Token())
}

// check fails the test unless every holder's token is greater than the
// one before.
func (h *holdings) check() {
	h.mu.Lock()
	defer h.mu.Unlock()
	var seq []string
	for _, x := range h.order {
		seq = append(seq, fmt.Sprintf("%s: %d", x.who, x.token))
	}
	h.t.Logf("holders in order: %s", strings.Join(seq, ", "))
	for i := 1; i < len(h.order); i++ {
		if h.order[i].token <= h.order[i-1].token {
			h.t.Errorf("%s got token %d after %s held %d: a later holder's token must be greater",
				h.order[i].who, h.order[i].token, h.order[i-1].who, h.order[i-1].token)
		}
	}
}

// theftRace is a priority-0 Locker A and a priority-2 Locker B on three
// masters, with gates on their calls: A's acquire on master 2, A's
// token write-backs (raise), B's acquires on masters 0 and 1, B's theft
// notices; and a gate, always open, that tells when A cleans up a failed
// attempt (release).
type theftRace struct {
	t                         *testing.T
	addrs                     []string
	name                      string
	a, b                      *client
	aAcquire2, aRaise, aClean *cmdGate
	bAcquire0, bAcquire1      *cmdGate
	bNotice                   *cmdGate
	held                      *holdings
}

// newTheftRace starts the masters and the Lockers and sets the name's
// fence counters on the masters to counters.
func newTheftRace(t *testing.T, ctx context.Context, counters [3]int64) *theftRace {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	opts := []redlockprio.Option{
		redlockprio.WithTTL(4 * time.Second), redlockprio.WithRenewInterval(1200 * time.Millisecond),
		// Room for the gates: a call held past it fails.
		redlockprio.WithCallTimeout(1900 * time.Millisecond),
	}
	r := &theftRace{
		t: t, addrs: addrs, name: uniqueName(t),
		a:         mustClient(t, addrs, append(opts, redlockprio.WithPriority(0))...),
		b:         mustClient(t, addrs, append(opts, redlockprio.WithPriority(2))...),
		aAcquire2: newCmdGate(runsScript("acquire")),
		aRaise:    newCmdGate(runsScript("raise")),
		aClean:    newCmdGate(runsScript("release")),
		bAcquire0: newCmdGate(runsScript("acquire")),
		bAcquire1: newCmdGate(runsScript("acquire")),
		bNotice:   newCmdGate(isTheftNotice),
	}
	r.held = &holdings{t: t, name: r.name}
	warm(t, r.a.l)
	warm(t, r.b.l)
	r.aClean.open() // only seen, never held
	r.aClean.armed.Store(true)
	t.Cleanup(func() {
		for _, g := range r.gates() {
			g.open()
		}
	})
	r.a.rcs[2].AddHook(r.aAcquire2)
	for _, rc := range r.a.rcs {
		rc.AddHook(r.aRaise)
		rc.AddHook(r.aClean)
	}
	r.b.rcs[0].AddHook(r.bAcquire0)
	r.b.rcs[1].AddHook(r.bAcquire1)
	for _, rc := range r.b.rcs {
		rc.AddHook(r.bNotice)
	}
	for i, c := range counters {
		rc := newRedis(addrs[i])
		err := rc.Set(ctx, "latchkey:{"+r.name+"}:fence", c, 0).Err()
		_ = rc.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func (r *theftRace) gates() []*cmdGate {
	return []*cmdGate{r.aAcquire2, r.aRaise, r.aClean, r.bAcquire0, r.bAcquire1, r.bNotice}
}

// lock runs l.Lock in the background; the lease, once held, is released
// when its context ends (a theft) or when letGo closes. done says the
// Lock's error (nil once released); returned closes when Lock returns.
func (r *theftRace) lock(ctx context.Context, who string, c *client, letGo <-chan struct{}) (done <-chan error, returned <-chan struct{}) {
	d := make(chan error, 1)
	ret := make(chan struct{})
	go func() {
		l, err := c.l.Lock(ctx, r.name)
		close(ret)
		if err != nil {
			d <- err
			return
		}
		r.held.add(who, l)
		select {
		case <-l.Context().Done():
		case <-letGo:
		}
		_ = l.Release(context.Background()) // an error once preempted
		d <- nil
	}()
	return d, ret
}

// finish lets A's write-back and the held acquires go on, then B's
// notice once A's Lock has returned or A has given its attempt up
// (which a fixed A does), waits for both Locks and checks the tokens.
func (r *theftRace) finish(aDone, bDone <-chan error, aReturned, bReturned <-chan struct{}, letGo chan struct{}) {
	t := r.t
	for _, g := range []*cmdGate{r.aRaise, r.aAcquire2, r.bAcquire0, r.bAcquire1} {
		g.armed.Store(false)
		g.open()
	}
	select {
	case <-aReturned:
	case <-r.aClean.seen:
	case <-time.After(10 * time.Second):
		t.Fatal("A's Lock neither returned nor gave its attempt up")
	}
	r.bNotice.open()
	// B holds the name until A's Lock has returned (and, if A held it
	// with the lower token, released it on B's notice); then both let go.
	select {
	case <-bReturned:
	case <-time.After(15 * time.Second):
		t.Fatal("B's Lock did not return")
	}
	close(letGo)
	for who, done := range map[string]<-chan error{"A": aDone, "B": bDone} {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s's Lock: %v", who, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("%s's Lock did not return", who)
		}
	}
	r.held.check()
}

// TestTheftBeforeTokenWriteBackKeepsTokensIncreasing: a priority-0
// attempt A wins masters 0 and 1, whose counters differ (34 and 21), so
// its token 34 must be written back to master 1 before Lock returns. A
// priority-2 thief B takes the name on masters 1 and 2 in between (its
// call to master 0, where A's counter is 34, answers late), and B's
// notice reaches A only after A's Lock has returned. A must not hold the
// name with a token at least B's: B, the later holder, got token 22 on
// counters that A's write-back had not reached. (It did: A held token 34,
// then B held 22 — the chaos run's "theft repeats or lowers the token",
// seeds 11, 12 and 63.)
func TestTheftBeforeTokenWriteBackKeepsTokensIncreasing(t *testing.T) {
	ctx := ctxFor(t, 25*time.Second)
	r := newTheftRace(t, ctx, [3]int64{33, 20, 20})
	for _, g := range []*cmdGate{r.aAcquire2, r.aRaise, r.bAcquire0, r.bNotice} {
		g.armed.Store(true)
	}
	letGo := make(chan struct{})
	// A wins masters 0 (counter 34) and 1 (21); its call to master 2 is
	// held, so the token 34 must be written back to master 1.
	aDone, aReturned := r.lock(ctx, "A (priority 0)", r.a, letGo)
	waitSeen(t, r.aRaise.seen, "A's token write-back")
	// B takes master 1 from A and master 2 (free), and wins on them
	// before its call to master 0 (A's key, counter 34) answers.
	bDone, bReturned := r.lock(ctx, "B (priority 2)", r.b, letGo)
	waitSeen(t, r.bNotice.seen, "B's theft notice")
	r.finish(aDone, bDone, aReturned, bReturned, letGo)
}

// TestHeldAnswerDoesNotRecordToken: the thief B got master 2 first (its
// counter 34), so A, winning masters 0 (34) and 1 (21), saw master 2
// "held" with counter 34. That counter does not record A's token for A:
// B then takes master 1 from A, where the counter is still 21, and
// wins with token 34, as a later holder than A. (It did: A counted
// master 2 as holding its token, returned at once with token 34 and
// left master 1's write-back to the background; B then held 34 too.)
func TestHeldAnswerDoesNotRecordToken(t *testing.T) {
	ctx := ctxFor(t, 25*time.Second)
	r := newTheftRace(t, ctx, [3]int64{33, 20, 33})
	for _, g := range []*cmdGate{r.aRaise, r.bAcquire0, r.bAcquire1, r.bNotice} {
		g.armed.Store(true)
	}
	letGo := make(chan struct{})
	// B takes master 2 (counter 34); its calls to masters 0 and 1 are held.
	bDone, bReturned := r.lock(ctx, "B (priority 2)", r.b, letGo)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.HasPrefix(holderOf(t, r.addrs[2], r.name), r.b.c.ID()+":") {
		if time.Now().After(deadline) {
			t.Fatal("B did not take master 2")
		}
		time.Sleep(2 * time.Millisecond)
	}
	// A wins masters 0 (34) and 1 (21) and sees master 2 held (34).
	aDone, aReturned := r.lock(ctx, "A (priority 0)", r.a, letGo)
	select {
	case <-aReturned:
	case <-r.aRaise.seen:
	case <-time.After(10 * time.Second):
		t.Fatal("A's Lock neither returned nor wrote its token back")
	}
	// B takes master 1 from A before A's write-back there, and wins.
	r.bAcquire1.armed.Store(false)
	r.bAcquire1.open()
	waitSeen(t, r.bNotice.seen, "B's theft notice")
	r.finish(aDone, bDone, aReturned, bReturned, letGo)
}
