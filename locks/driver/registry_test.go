package driver_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// TestRegistryRenewsInBatches: every round hands all live leases to one
// RenewFunc call, and the answers extend, end (then clean up) or leave
// each lease.
func TestRegistryRenewsInBatches(t *testing.T) {
	var maxBatch atomic.Int32
	cleaned := make(chan string, 1)
	reg, err := driver.NewRegistry(driver.Config{Backend: "test", RenewEvery: 5 * time.Millisecond,
		Renew: func(ctx context.Context, batch []*driver.Lease) []driver.Renewal {
			if n := int32(len(batch)); n > maxBatch.Load() {
				maxBatch.Store(n)
			}
			out := make([]driver.Renewal, len(batch))
			for i, l := range batch {
				if l.Name() == "doomed" {
					out[i] = driver.Renewal{Err: driver.Lost(errors.New("gone at the broker")),
						Then: func() { cleaned <- l.Name() }}
					continue
				}
				out[i] = driver.Renewal{Until: time.Now().Add(time.Minute)}
			}
			return out
		}})
	if err != nil {
		t.Fatal(err)
	}
	var leases []*driver.Lease
	for _, name := range []string{"a", "b", "c", "doomed"} {
		l, err := reg.NewLease(context.Background(), driver.Spec{Name: name, Deadline: time.Now().Add(100 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	select {
	case name := <-cleaned:
		if name != "doomed" {
			t.Fatalf("clean-up ran for %q", name)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the lost lease's clean-up never ran")
	}
	if cause := context.Cause(leases[3].Context()); !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("doomed lease's cause = %v, want ErrLost", cause)
	}
	time.Sleep(150 * time.Millisecond) // past the first deadline: renewals must have moved it
	for _, l := range leases[:3] {
		if err := l.Context().Err(); err != nil {
			t.Fatalf("%s ended although renewed: %v", l.Name(), context.Cause(l.Context()))
		}
	}
	if n := maxBatch.Load(); n != 4 {
		t.Fatalf("largest batch %d, want 4 (all leases in one round)", n)
	}
	if err := reg.Close(context.Background(), nil); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, l := range leases[:3] {
		cause := context.Cause(l.Context())
		if !errors.Is(cause, locks.ErrLost) || !errors.Is(cause, locks.ErrClosed) {
			t.Fatalf("after Close, cause = %v, want ErrLost and ErrClosed", cause)
		}
	}
}

// TestRegistryCloseReleasesAndRefuses: Close releases every lease at the
// broker, returns the failures, and refuses new leases.
func TestRegistryCloseReleasesAndRefuses(t *testing.T) {
	reg, err := driver.NewRegistry(driver.Config{Backend: "test"})
	if err != nil {
		t.Fatal(err)
	}
	var released sync.Map
	for _, name := range []string{"ok", "fails"} {
		_, err := reg.NewLease(context.Background(), driver.Spec{Name: name, Release: func(context.Context) error {
			released.Store(name, true)
			if name == "fails" {
				return errors.New("broker said no")
			}
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	err = reg.Close(context.Background(), nil)
	if err == nil {
		t.Fatal("Close hid a failed release")
	}
	for _, name := range []string{"ok", "fails"} {
		if _, ok := released.Load(name); !ok {
			t.Fatalf("Close did not release %q", name)
		}
	}
	if _, err := reg.NewLease(context.Background(), driver.Spec{Name: "late"}); !errors.Is(err, locks.ErrClosed) {
		t.Fatalf("NewLease after Close: %v, want ErrClosed", err)
	}
	if reg.Go(func() {}) {
		t.Fatal("Go started a goroutine after Close")
	}
	if err := reg.Close(context.Background(), nil); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestRegistryCloseBoundedByContext: a release that hangs does not hold
// Close past its context.
func TestRegistryCloseBoundedByContext(t *testing.T) {
	reg, _ := driver.NewRegistry(driver.Config{Backend: "test"})
	unblock := make(chan struct{})
	defer close(unblock)
	if _, err := reg.NewLease(context.Background(), driver.Spec{Name: "stuck", Release: func(context.Context) error {
		<-unblock
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := reg.Close(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a hung release: %v, want DeadlineExceeded", err)
	}
}

// TestRegistryReleaseWaitsForRound: a lease's Release never reaches the
// broker while a renewal round holding it runs.
func TestRegistryReleaseWaitsForRound(t *testing.T) {
	var inRound atomic.Int32
	started := make(chan struct{}, 1)
	reg, _ := driver.NewRegistry(driver.Config{Backend: "test", RenewEvery: time.Millisecond,
		Renew: func(ctx context.Context, batch []*driver.Lease) []driver.Renewal {
			inRound.Add(1)
			defer inRound.Add(-1)
			select {
			case started <- struct{}{}:
			default:
			}
			time.Sleep(10 * time.Millisecond)
			return nil
		}})
	defer reg.Close(context.Background(), nil)
	l, err := reg.NewLease(context.Background(), driver.Spec{Name: "n", Release: func(context.Context) error {
		if n := inRound.Load(); n != 0 {
			t.Errorf("broker told of the release while %d rounds ran", n)
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if err := l.Handle().Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if n := len(reg.Leases()); n != 0 {
		t.Fatalf("%d leases still registered after Release", n)
	}
}

// TestRegistryEvents: observers get the kit's renewal events and the
// backend's own, and stop getting them.
func TestRegistryEvents(t *testing.T) {
	reg, _ := driver.NewRegistry(driver.Config{Backend: "test", RenewEvery: 2 * time.Millisecond,
		Renew: func(ctx context.Context, batch []*driver.Lease) []driver.Renewal {
			return []driver.Renewal{{Err: errors.New("timeout")}}
		}})
	defer reg.Close(context.Background(), nil)
	got := make(chan driver.Event, 64)
	stop := reg.Observe(func(ev driver.Event) {
		select {
		case got <- ev:
		default:
		}
	})
	l, _ := reg.NewLease(context.Background(), driver.Spec{Name: "n", Deadline: time.Now().Add(time.Minute)})
	reg.Emit(driver.Event{Kind: driver.EventTheft, Name: "n"})
	seen := map[driver.EventKind]bool{}
	timeout := time.After(5 * time.Second)
	for !(seen[driver.EventRenewFailed] && seen[driver.EventRenewRound] && seen[driver.EventTheft]) {
		select {
		case ev := <-got:
			if ev.Backend != "test" {
				t.Fatalf("event without its backend: %+v", ev)
			}
			seen[ev.Kind] = true
		case <-timeout:
			t.Fatalf("events seen: %v", seen)
		}
	}
	stop()
	_ = l.Release(context.Background())
}

// TestHandleHidesTheKit: what a backend hands users has no Extend or End.
func TestHandleHidesTheKit(t *testing.T) {
	l := driver.NewLease(context.Background(), driver.Spec{Name: "n", Token: 3, Slot: 2})
	var h any = l.Handle()
	if _, ok := h.(interface{ End(error) bool }); ok {
		t.Fatal("a lease's handle exposes End")
	}
	if _, ok := h.(interface{ Extend(time.Time) bool }); ok {
		t.Fatal("a lease's handle exposes Extend")
	}
	s := h.(locks.SlotLease)
	if s.Token() != 3 || s.Slot() != 2 || s.Name() != "n" {
		t.Fatalf("handle: token %d slot %d name %q", s.Token(), s.Slot(), s.Name())
	}
	_ = s.Release(context.Background())
}

func TestCheckHolderID(t *testing.T) {
	for _, id := range []string{"", "a|b", "a{b", "a\nb", "a\u00a0b", string(make([]byte, 201))} {
		if err := driver.CheckHolderID(id); !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("CheckHolderID(%q) = %v, want ErrInvalidOption", id, err)
		}
	}
	for _, id := range []string{"host-1", "worker 7/eu", "ünïcode"} {
		if err := driver.CheckHolderID(id); err != nil {
			t.Errorf("CheckHolderID(%q) = %v", id, err)
		}
	}
}

func TestErrorf(t *testing.T) {
	err := driver.Errorf("natsputex", "lock", "jobs", context.DeadlineExceeded)
	if !errors.Is(err, context.DeadlineExceeded) || err.Error() != `natsputex: lock "jobs": context deadline exceeded` {
		t.Fatalf("Errorf = %q", err)
	}
	if driver.Errorf("x", "y", "z", nil) != nil {
		t.Fatal("Errorf(nil) is not nil")
	}
}

func TestErrorfNamesOnce(t *testing.T) {
	err := driver.Errorf("memlock", "trylock", "jobs", &locks.HeldError{Name: "jobs", Holder: "c1"})
	if got, want := err.Error(), `memlock: trylock: locks: not acquired: "jobs" is held by c1`; got != want {
		t.Fatalf("Errorf = %q, want %q", got, want)
	}
}

// TestRegistryLostLeasesEndTogether: the leases a round finds lost all end
// before any clean-up runs, and the clean-ups run concurrently (found by
// an attack: ten blanks one round trip apart, each lease ending in turn).
func TestRegistryLostLeasesEndTogether(t *testing.T) {
	const n = 8
	var running, most atomic.Int32
	var leases []*driver.Lease
	var mu sync.Mutex
	endedBeforeCleanup := true
	reg, _ := driver.NewRegistry(driver.Config{Backend: "test", RenewEvery: 5 * time.Millisecond,
		Renew: func(ctx context.Context, batch []*driver.Lease) []driver.Renewal {
			out := make([]driver.Renewal, len(batch))
			for i := range batch {
				out[i] = driver.Renewal{Err: driver.Lost(errors.New("health check failed")), Then: func() {
					mu.Lock()
					for _, l := range leases {
						if l.Live() {
							endedBeforeCleanup = false
						}
					}
					mu.Unlock()
					if c := running.Add(1); c > most.Load() {
						most.Store(c)
					}
					time.Sleep(30 * time.Millisecond) // a slow broker
					running.Add(-1)
				}}
			}
			return out
		}})
	mu.Lock()
	for i := range n {
		l, err := reg.NewLease(context.Background(), driver.Spec{Name: fmt.Sprint(i), Deadline: time.Now().Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	mu.Unlock()
	for _, l := range leases {
		<-l.Context().Done()
	}
	if err := reg.Close(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !endedBeforeCleanup {
		t.Error("a clean-up ran while another lost lease of its round was still live")
	}
	if most.Load() < 2 {
		t.Errorf("clean-ups ran one at a time (at most %d at once)", most.Load())
	}
}

// TestCloseReportsConcurrentRelease: a Release under way when Close
// begins does the release at the broker; Close waits for it and returns
// its error too (a natsputex Supervisor's failed Stop is such an error).
func TestCloseReportsConcurrentRelease(t *testing.T) {
	r, err := driver.NewRegistry(driver.Config{Backend: "test"})
	if err != nil {
		t.Fatal(err)
	}
	inRelease, unblock := make(chan struct{}), make(chan struct{})
	failed := errors.New("release failed (test)")
	l, err := r.NewLease(context.Background(), driver.Spec{Name: "a", Release: func(context.Context) error {
		close(inRelease)
		<-unblock
		return failed
	}})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = l.Release(context.Background()) }()
	<-inRelease
	closed := make(chan error, 1)
	go func() { closed <- r.Close(context.Background(), nil) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned %v before the Release under way finished", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(unblock)
	if err := <-closed; !errors.Is(err, failed) {
		t.Fatalf("Close = %v, want the error of the Release under way", err)
	}
}

// TestCloseEndsLeasesBeforeRound: a renewal round under way when Close
// begins, and answering "lost" once Close cuts it short, never ends a
// lease first: every lease ends with Close's cause (ErrLost and
// ErrClosed), not the round's.
func TestCloseEndsLeasesBeforeRound(t *testing.T) {
	inRound := make(chan struct{}, 1)
	reg, _ := driver.NewRegistry(driver.Config{Backend: "test", RenewEvery: time.Millisecond,
		Renew: func(ctx context.Context, batch []*driver.Lease) []driver.Renewal {
			select {
			case inRound <- struct{}{}:
			default:
			}
			<-ctx.Done()
			out := make([]driver.Renewal, len(batch))
			for i := range out {
				out[i] = driver.Renewal{Err: driver.Lost(fmt.Errorf("renewal failed: %w", ctx.Err()))}
			}
			return out
		}})
	var leases []*driver.Lease
	for i := range 50 {
		l, err := reg.NewLease(context.Background(), driver.Spec{Name: fmt.Sprint("n", i), Deadline: time.Now().Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	<-inRound
	if err := reg.Close(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		if cause := context.Cause(l.Context()); !errors.Is(cause, locks.ErrClosed) {
			t.Errorf("%s ended with %v, not Close's cause", l.Name(), cause)
		}
	}
}

// TestCloseWaitsForCalls: Close ends a running Call's context and returns
// only once the call has called its cancel (what the call does on its way
// out happens before Close returns); a Call made after Close is not waited
// for, and its context has ended already.
func TestCloseWaitsForCalls(t *testing.T) {
	reg, err := driver.NewRegistry(driver.Config{Backend: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, done := reg.Call(context.Background())
	var exited atomic.Bool
	go func() {
		<-ctx.Done()
		time.Sleep(20 * time.Millisecond) // the call's way out
		exited.Store(true)
		done()
	}()
	if err := reg.Close(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if !exited.Load() {
		t.Fatal("Close returned before the running call did")
	}
	if !errors.Is(context.Cause(ctx), locks.ErrClosed) {
		t.Errorf("the call's context ended with %v, want ErrClosed", context.Cause(ctx))
	}
	late, lateDone := reg.Call(context.Background())
	defer lateDone()
	if late.Err() == nil {
		t.Error("a Call after Close has a live context")
	}
}

// TestReleaseBoundedByContextDuringRound: a Release whose ctx ends while
// a renewal round with its lease hangs returns ctx's error without
// waiting for the round; the broker is told of the release once the
// round is over, in the background, and the lease is then forgotten.
func TestReleaseBoundedByContextDuringRound(t *testing.T) {
	inRound := make(chan struct{}, 1)
	unblock := make(chan struct{})
	reg, _ := driver.NewRegistry(driver.Config{Backend: "test", RenewEvery: time.Millisecond,
		Renew: func(ctx context.Context, batch []*driver.Lease) []driver.Renewal {
			select {
			case inRound <- struct{}{}:
			default:
			}
			<-unblock
			return nil
		}})
	defer reg.Close(context.Background(), nil)
	var roundOver, toldDuringRound atomic.Bool
	told := make(chan error, 1)
	l, err := reg.NewLease(context.Background(), driver.Spec{Name: "n", Release: func(ctx context.Context) error {
		toldDuringRound.Store(!roundOver.Load())
		told <- ctx.Err()
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	<-inRound
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	released := make(chan error, 1)
	go func() { released <- l.Handle().Release(ctx) }()
	select {
	case err = <-released:
	case <-time.After(5 * time.Second):
		roundOver.Store(true)
		close(unblock)
		t.Fatalf("Release with a 50ms ctx still waits for a hung round after 5s (it returned %v once the round ended)", <-released)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Release during a hung round: %v, want context.DeadlineExceeded", err)
	}
	if n := len(reg.Leases()); n != 1 {
		t.Errorf("%d leases registered while the round runs, want 1", n)
	}
	roundOver.Store(true)
	close(unblock)
	select {
	case cerr := <-told:
		if cerr != nil {
			t.Errorf("the background release ran with an ended context: %v", cerr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the broker was not told of the release 5s after the round ended")
	}
	if toldDuringRound.Load() {
		t.Error("the broker was told of the release while the round still ran")
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(reg.Leases()) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the released lease still registered 5s after its round ended")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReleaseInBackgroundThenClose: after a Release whose ctx ended
// during a hung renewal round, a second Release returns the first one's
// result at once, and a Close that follows ends the round, still tells
// the broker of the release with a live context (the name is freed now,
// not at the TTL), waits for it and returns its error.
func TestReleaseInBackgroundThenClose(t *testing.T) {
	inRound := make(chan struct{}, 1)
	reg, _ := driver.NewRegistry(driver.Config{Backend: "test", RenewEvery: time.Millisecond,
		Renew: func(ctx context.Context, batch []*driver.Lease) []driver.Renewal {
			select {
			case inRound <- struct{}{}:
			default:
			}
			<-ctx.Done() // a round that hangs until Close cuts it short
			return nil
		}})
	failed := errors.New("broker said no (test)")
	var toldErr atomic.Value
	var finished atomic.Bool
	l, err := reg.NewLease(context.Background(), driver.Spec{Name: "n", Deadline: time.Now().Add(time.Minute),
		Release: func(ctx context.Context) error {
			toldErr.Store(fmt.Sprint(ctx.Err()))
			time.Sleep(20 * time.Millisecond) // the broker's round trip
			finished.Store(true)
			return failed
		}})
	if err != nil {
		t.Fatal(err)
	}
	<-inRound
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := l.Handle().Release(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release during a hung round: %v, want DeadlineExceeded", err)
	}
	again := make(chan error, 1)
	go func() { again <- l.Handle().Release(context.Background()) }()
	select {
	case err := <-again:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("second Release: %v, want the first one's result (DeadlineExceeded)", err)
		}
	case <-time.After(2 * time.Second):
		t.Error("second Release still waits for the hung round after 2s")
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	cerr := reg.Close(cctx, nil)
	if !finished.Load() {
		t.Fatalf("Close returned (%v) before the background release finished", cerr)
	}
	if got := toldErr.Load(); got != "<nil>" {
		t.Errorf("the background release ran with an ended context (%v): the broker frees the name only at the TTL", got)
	}
	if !errors.Is(cerr, failed) {
		t.Errorf("Close = %v, want the error of the background release", cerr)
	}
}
