package benchmarks

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Kind says what a system is in the comparison.
type Kind int

// The kinds of systems.
const (
	Backend Kind = iota + 1 // a latchkey backend
	Peer                    // another library, the baseline to beat
	Floor                   // the broker's raw operations: the least a lock can cost
)

func (k Kind) String() string {
	switch k {
	case Backend:
		return "backend"
	case Peer:
		return "peer"
	case Floor:
		return "floor"
	}
	return "?"
}

// Entry is one system in the registry.
type Entry struct {
	Name string // as in the results: "natsputex/R3", "redsync/N3", "floor/redis"
	Kind Kind

	// Needs is the broker the system runs on (0 for none); Masters is how
	// many Redis masters it needs.
	Needs   Broker
	Masters int

	// Floor is the system this one's ratio to its floor is taken against;
	// Peers are the systems its ratio to the best peer is taken against.
	Floor string
	Peers []string

	// New builds the system on env's brokers. It fails with an error
	// matching [ErrUnavailable] when env lacks what the system needs.
	New func(ctx context.Context, env Env) (System, error)

	// Twin, when not empty, is the system this one wraps: a +otel variant
	// is its twin with lockotel around each client's Locker (see
	// [OtelSuffix]). The report gives the variant's overhead over its twin.
	// Variants are optional: only their exact names pick them in [Match].
	Twin string

	// NotWired, when not empty, says why this version of the benchmarks
	// cannot build the system (New then always fails).
	NotWired string
}

// Systems returns the registry: every system the benchmarks know, in the
// order they are reported. The caller may modify the returned slice.
func Systems() []Entry {
	redisPeers := func(n int) []string {
		if n == 1 {
			return []string{"redsync/N1", "redislock"}
		}
		return []string{fmt.Sprintf("redsync/N%d", n)}
	}
	es := []Entry{
		{Name: "memlock", Kind: Backend, New: newMemlock},
	}
	es = append(es, withOtelVariants(natsputexEntries())...)
	es = append(es, amqpsemEntries()...)
	es = append(es, Entry{Name: "amqpsem/quorum", Kind: Backend, Needs: AMQP, Floor: "floor/amqp", New: newAmqpsemQuorum})
	for _, n := range []int{1, 3, 5} {
		es = append(es, withOtelVariants([]Entry{redlockprioEntry(n, redisPeers(n))})...)
	}
	for _, n := range []int{1, 3, 5} {
		es = append(es, Entry{Name: fmt.Sprintf("redsync/N%d", n), Kind: Peer, Needs: Redis, Masters: n,
			Floor: "floor/redis", New: newRedsync(n)})
	}
	es = append(es,
		Entry{Name: "redislock", Kind: Peer, Needs: Redis, Masters: 1, Floor: "floor/redis", New: newRedislock},
		Entry{Name: "floor/redis", Kind: Floor, Needs: Redis, Masters: 1, New: newRedisFloor},
		Entry{Name: "floor/nats-kv", Kind: Floor, Needs: NATS, New: newNATSFloor},
		Entry{Name: "floor/amqp", Kind: Floor, Needs: AMQP, New: newAMQPFloor},
	)
	return es
}

// Lookup returns the registry entry named name.
func Lookup(name string) (Entry, bool) {
	for _, e := range Systems() {
		if e.Name == name {
			return e, true
		}
	}
	return Entry{}, false
}

// Match returns the entries, in registry order, whose names match any of
// the comma-separated patterns. A pattern is a [path.Match] glob ("redsync/*",
// "floor/*") or a prefix ending in "/" ("redlockprio/"); "" and "all" match
// everything but the optional variants (entries with a [Entry.Twin]),
// which only their exact names pick (or [WithVariants]). A pattern that
// matches nothing is an error, so that a typo does not silently shrink a
// run.
func Match(patterns string) ([]Entry, error) {
	all := Systems()
	if p := strings.TrimSpace(patterns); p == "" || p == "all" {
		return slices.DeleteFunc(all, func(e Entry) bool { return e.Twin != "" }), nil
	}
	picked := make([]bool, len(all))
	for p := range strings.SplitSeq(patterns, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		hit := false
		for i, e := range all {
			ok, err := path.Match(p, e.Name)
			if err != nil {
				return nil, fmt.Errorf("benchmarks: bad pattern %q: %w", p, err)
			}
			if e.Twin != "" && p != e.Name {
				continue
			}
			if ok || (strings.HasSuffix(p, "/") && strings.HasPrefix(e.Name, p)) {
				picked[i], hit = true, true
			}
		}
		if !hit {
			return nil, fmt.Errorf("benchmarks: no system matches %q (systems: %s)", p, strings.Join(Names(all), ", "))
		}
	}
	var out []Entry
	for i, e := range all {
		if picked[i] {
			out = append(out, e)
		}
	}
	return out, nil
}

// WithVariants returns es, in registry order, with the variants (see
// [Entry.Twin]) of the systems in es added.
func WithVariants(es []Entry) []Entry {
	in := map[string]bool{}
	for _, e := range es {
		in[e.Name] = true
	}
	var out []Entry
	for _, e := range Systems() {
		if in[e.Name] || (e.Twin != "" && in[e.Twin]) {
			out = append(out, e)
		}
	}
	return out
}

// Names returns the entries' names.
func Names(es []Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Name
	}
	return out
}
