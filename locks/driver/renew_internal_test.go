package driver

import (
	"context"
	"testing"
	"time"
)

// TestRenewLoopRunsOnlyWhileLeasesLive: a registry renews all its leases
// from one goroutine, which exits once no lease is left while the
// registry stays open, and comes back with the next lease.
func TestRenewLoopRunsOnlyWhileLeasesLive(t *testing.T) {
	const every = 5 * time.Millisecond
	reg, err := NewRegistry(Config{Backend: "test", RenewEvery: every,
		Renew: func(_ context.Context, batch []*Lease) []Renewal {
			out := make([]Renewal, len(batch))
			for i := range out {
				out[i] = Renewal{Until: time.Now().Add(time.Minute)}
			}
			return out
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(context.Background(), nil)
	ctx := context.Background()
	// loopsBecome polls the number of renewal goroutines until it is
	// want, for up to 5s.
	loopsBecome := func(what string, want int32) {
		t.Helper()
		for start := time.Now(); reg.loops.Load() != want; time.Sleep(time.Millisecond) {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("%s: %d renewal goroutines after 5s, want %d", what, reg.loops.Load(), want)
			}
		}
	}
	// renewed waits until l's deadline moves.
	renewed := func(l *Lease) {
		t.Helper()
		first := l.Deadline()
		for start := time.Now(); !l.Deadline().After(first); time.Sleep(time.Millisecond) {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("%q not renewed in 5s (every %v)", l.Name(), every)
			}
		}
	}
	lease := func(name string) *Lease {
		l, err := reg.NewLease(ctx, Spec{Name: name, Deadline: time.Now().Add(time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	if n := reg.loops.Load(); n != 0 {
		t.Fatalf("before any lease: %d renewal goroutines", n)
	}
	a, b := lease("a"), lease("b")
	loopsBecome("two leases", 1)
	renewed(a)
	renewed(b)
	if n := reg.loops.Load(); n != 1 {
		t.Fatalf("two leases renewed by %d goroutines, want one", n)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	renewed(b)
	if n := reg.loops.Load(); n != 1 {
		t.Fatalf("one lease left: %d renewal goroutines, want one", n)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	loopsBecome("no lease left", 0)
	time.Sleep(10 * every) // ticks it would have taken, had it stayed
	if n := reg.loops.Load(); n != 0 {
		t.Fatalf("no lease for 10 intervals: %d renewal goroutines came back", n)
	}
	c := lease("c")
	loopsBecome("the next lease", 1)
	renewed(c)
}
