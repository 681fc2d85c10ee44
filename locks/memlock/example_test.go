package memlock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// Code under test takes a locks.Locker; its unit tests hand it memlock.
func Example() {
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
