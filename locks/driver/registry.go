package driver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// Config describes a client's [Registry].
type Config struct {
	// Backend names the backend in errors and events: "natsputex".
	Backend string

	// RenewEvery is the interval of the renewal rounds; Renew renews the
	// leases. Leave both zero for a backend whose leases need no renewal.
	RenewEvery time.Duration
	Renew      RenewFunc
}

// RenewFunc renews a batch of live leases in one round, one broker round
// trip for all of them where the broker allows it. It returns one
// [Renewal] per lease of batch, in the same order (a shorter slice leaves
// the rest unrenewed this round). ctx ends at the earliest validity
// deadline in the batch, or when the registry closes.
type RenewFunc func(ctx context.Context, batch []*Lease) []Renewal

// Renewal is a backend's answer for one lease of a renewal round.
type Renewal struct {
	// Until is the lease's new validity deadline when Err is nil; a zero
	// Until leaves the deadline as it was.
	Until time.Time

	// Err, when it matches [locks.ErrLost] (or [locks.ErrPreempted]),
	// ends the lease with Err as its cause. Any other error leaves the
	// lease to the next round; its deadline ends it if no renewal lands
	// in time.
	Err error

	// Then, if set, runs after the lease has ended with Err: the clean-up
	// a lost lease needs at the broker. The clean-ups of a round run
	// concurrently, after every lost lease of the round has ended, in
	// goroutines Close waits for; the lease's Release waits for its
	// clean-up before it calls the broker.
	Then func()
}

// Registry owns a client's leases: it registers them, renews them in
// batches, tracks the client's goroutines, and ends and releases them all
// on Close. Every backend's client has one.
//
// A Registry is safe for concurrent use.
type Registry struct {
	backend string
	every   time.Duration
	renew   RenewFunc
	events  Events

	ctx    context.Context // ends on Close, with cause locks.ErrClosed
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	leases   map[*Lease]struct{}
	closed   bool
	renewing bool         // the renewal goroutine runs
	loops    atomic.Int32 // renewal goroutines running, for the tests
	wg       sync.WaitGroup
	done     chan struct{} // closed when Close has finished everything
}

// NewRegistry returns an open Registry for cfg. It returns an error
// matching [locks.ErrInvalidOption] when only one of RenewEvery and Renew
// is set, or RenewEvery is negative.
func NewRegistry(cfg Config) (*Registry, error) {
	if (cfg.RenewEvery > 0) != (cfg.Renew != nil) || cfg.RenewEvery < 0 {
		return nil, InvalidOption("%s: a registry needs both a renewal interval and a renew function, or neither", cfg.Backend)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Registry{
		backend: cfg.Backend,
		every:   cfg.RenewEvery,
		renew:   cfg.Renew,
		events:  Events{backend: cfg.Backend},
		ctx:     ctx,
		cancel:  cancel,
		leases:  make(map[*Lease]struct{}),
		done:    make(chan struct{}),
	}, nil
}

// Backend returns the backend's name, as given in [Config].
func (r *Registry) Backend() string { return r.backend }

// Context returns a context that ends when the registry closes, with
// cause [locks.ErrClosed].
func (r *Registry) Context() context.Context { return r.ctx }

// Closed reports whether Close has been called.
func (r *Registry) Closed() bool { return r.ctx.Err() != nil }

// ErrClosed returns the error of an operation op on name refused because
// the registry is closed: it matches [locks.ErrClosed].
func (r *Registry) ErrClosed(op, name string) error {
	return Errorf(r.backend, op, name, locks.ErrClosed)
}

// Bind returns a context that ends with ctx or when the registry closes
// (then with cause [locks.ErrClosed]), and its cancel function, which the
// caller must call.
func (r *Registry) Bind(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(r.ctx, func() { cancel(locks.ErrClosed) })
	if r.ctx.Err() != nil {
		cancel(locks.ErrClosed) // at once: AfterFunc runs on its own goroutine
	}
	return ctx, func() { stop(); cancel(nil) }
}

// Call is Bind for a call of the client that Close waits for: Close
// ends the call's context, then waits (as long as its own ctx allows) for
// the call to return and call the returned cancel, so that what the call
// does on its way out (handing a turn on, freeing what it won) happens
// before Close returns and the caller tears its connection down.
func (r *Registry) Call(ctx context.Context) (context.Context, context.CancelFunc) {
	bctx, stop := r.Bind(ctx)
	r.mu.Lock()
	tracked := !r.closed
	if tracked {
		r.wg.Add(1)
	}
	r.mu.Unlock()
	var once sync.Once
	return bctx, func() {
		once.Do(func() {
			stop()
			if tracked {
				r.wg.Done()
			}
		})
	}
}

// Go runs f in a goroutine that Close waits for, unless the registry is
// closed; it reports whether f was started. f should return soon after
// [Registry.Context] ends.
func (r *Registry) Go(f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Go(f)
	return true
}

// NewLease registers a live lease described by spec, and renews it with
// the registry's [RenewFunc] until it ends. Its context carries parent's
// values but not its cancellation. On a closed registry it returns
// [locks.ErrClosed] itself, for the caller to wrap with its operation, and
// the backend must free what it won at the broker itself.
func (r *Registry) NewLease(parent context.Context, spec Spec) (*Lease, error) {
	l := NewLease(parent, spec)
	l.reg = r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		l.End(Lost(locks.ErrClosed))
		return nil, locks.ErrClosed
	}
	r.leases[l] = struct{}{}
	if r.renew != nil && !r.renewing {
		r.renewing = true
		r.wg.Go(r.renewLoop)
	}
	return l, nil
}

// Leases returns the leases registered and not yet released, live or
// ended, in no particular order.
func (r *Registry) Leases() []*Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Lease, 0, len(r.leases))
	for l := range r.leases {
		out = append(out, l)
	}
	return out
}

// forget drops a released lease.
func (r *Registry) forget(l *Lease) {
	r.mu.Lock()
	delete(r.leases, l)
	r.mu.Unlock()
}

// Close ends every lease with cause (an error matching [locks.ErrLost] and
// [locks.ErrClosed] if cause is nil), releases them all at the broker in
// parallel, makes [Registry.Context] end, and waits for the goroutines
// started by Go and the renewal loop. Every wait is bounded by ctx: when
// ctx ends first, Close returns an error matching ctx.Err() and the rest
// finishes in the background ([Registry.Done] says when). Close returns
// the errors of the releases at the broker that failed, each naming its
// lease, for the backend to wrap with its own name ([Errorf]), also those
// of a Release that was under way when Close began. It is idempotent:
// later calls return nil at once.
func (r *Registry) Close(ctx context.Context, cause error) error {
	if err := CheckContext(ctx, r.backend, "close", ""); err != nil {
		return err // nothing closed: Close may be called again
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	held := make([]*Lease, 0, len(r.leases))
	for l := range r.leases {
		held = append(held, l)
	}
	r.mu.Unlock()
	if cause == nil {
		cause = Lost(fmt.Errorf("%s: client closed: %w", r.backend, locks.ErrClosed))
	}
	// Every lease ends with cause before the registry's context does: a
	// renewal round under way, cut short by it, would otherwise end some
	// of them first as lost to a failed renewal.
	for _, l := range held {
		l.End(cause) // a no-op for a lease that ended earlier
	}
	r.cancel(locks.ErrClosed)

	var (
		mu   sync.Mutex
		errs []error
		rel  sync.WaitGroup
	)
	for _, l := range held {
		rel.Go(func() {
			l.releaseOnce.Do(func() {
				// Without ctx's cancellation: a release cut short would leave
				// the name held until the broker's TTL; the backend bounds
				// its own calls, and Close stops waiting when ctx ends.
				_ = l.free(context.WithoutCancel(ctx))
				l.releaseErr = Errorf(r.backend, "release", l.Name(), context.Cause(l.ctx))
			})
			// Also when a Release under way when Close began did the work,
			// or left it to the background (its ctx ended during a round).
			if l.bgFree != nil {
				<-l.bgFree
			}
			if err := l.freeErr; err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("release %q: %w", l.Name(), err))
				mu.Unlock()
			}
		})
	}
	go func() {
		rel.Wait()
		r.wg.Wait()
		close(r.done)
	}()
	select {
	case <-r.done:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		return errors.Join(append(errs, ctx.Err())...)
	}
	return errors.Join(errs...)
}

// Done returns a channel closed once Close has released every lease and
// every goroutine started by Go has returned: after Close returned early
// (its ctx ended), a backend waits on it before it lets go of what the
// releases still need (its connections, its workers).
func (r *Registry) Done() <-chan struct{} { return r.done }
