package memlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// A client of a Store, closed when done, with the work done under the
// lease's context, which ends should the lease be lost.
func Example() {
	store := memlock.New()
	ctx := context.Background()
	c, err := store.NewClient(memlock.WithTTL(time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close(ctx)

	lease, err := c.Locker().Lock(ctx, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lease.Release(ctx)
	work := func(ctx context.Context) error { return ctx.Err() }
	fmt.Println("work done:", work(lease.Context()) == nil, "token", lease.Token())
	// Output: work done: true token 1
}

// Code under test takes a locks.Locker; its unit tests hand it memlock.
func Example_contention() {
	store := memlock.New()
	a, _ := store.NewLocker()
	b, _ := store.NewLocker()
	ctx := context.Background()

	lease, _ := a.Lock(ctx, "nightly-report")
	fmt.Println("a holds it with token", lease.Token())

	_, err := b.TryLock(ctx, "nightly-report")
	fmt.Println("b:", errors.Is(err, locks.ErrNotAcquired))

	_ = lease.Release(ctx)
	lease, _ = b.TryLock(ctx, "nightly-report")
	fmt.Println("b holds it with token", lease.Token())
	_ = lease.Release(ctx)
	// Output:
	// a holds it with token 1
	// b: true
	// b holds it with token 2
}

// Revoke shows what happens to code whose lock is taken away: the lease's
// context ends, with a cause.
func ExampleStore_Revoke() {
	store := memlock.New()
	l, _ := store.NewLocker()
	lease, _ := l.Lock(context.Background(), "migrations")

	store.Revoke("migrations")
	<-lease.Context().Done()
	fmt.Println(errors.Is(context.Cause(lease.Context()), locks.ErrLost))
	// Output: true
}

// A higher priority takes the name; the holder learns it from its context.
func ExampleWithPriority() {
	store := memlock.New()
	batch, _ := store.NewLocker(memlock.WithPriority(1))
	urgent, _ := store.NewLocker(memlock.WithPriority(10))
	ctx := context.Background()

	victim, _ := batch.Lock(ctx, "printer")
	thief, _ := urgent.Lock(ctx, "printer")
	fmt.Println(errors.Is(context.Cause(victim.Context()), locks.ErrPreempted))
	fmt.Println(thief.Token() > victim.Token())
	_ = thief.Release(ctx)
	// Output:
	// true
	// true
}
