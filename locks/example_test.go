package locks_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// Do runs a function while holding a lock; the function's context ends if
// the lock is lost, so the work stops with it.
func ExampleDo() {
	var l locks.Locker // any backend: natsputex, amqpsem, redlockprio, memlock
	l, _ = memlock.New().NewLocker()

	err := locks.Do(context.Background(), l, "invoice-run", func(ctx context.Context) error {
		fmt.Println("exclusive work")
		return ctx.Err()
	})
	fmt.Println(err)
	// Output:
	// exclusive work
	// <nil>
}

// A lease's context tells why it ended.
func ExampleLease_context() {
	l, _ := memlock.New().NewLocker()
	lease, _ := l.Lock(context.Background(), "job")
	_ = lease.Release(context.Background())

	<-lease.Context().Done()
	cause := context.Cause(lease.Context())
	fmt.Println(errors.Is(cause, locks.ErrReleased), errors.Is(cause, locks.ErrLost))
	// Output: true false
}

// Blocking calls end with the context: a deadline is never reported as
// "not acquired".
func ExampleLocker_tryLock() {
	l, _ := memlock.New().NewLocker()
	ctx := context.Background()
	held, _ := l.Lock(ctx, "job")
	defer held.Release(ctx)

	_, err := l.TryLock(ctx, "job")
	fmt.Println(errors.Is(err, locks.ErrNotAcquired))
	// Output: true
}
