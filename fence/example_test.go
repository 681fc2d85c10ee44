package fence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// A holder that lost its lock while it worked is refused once its
// successor has written.
func Example() {
	ctx := context.Background()
	c, _ := memlock.New().NewClient()
	defer c.Close(ctx)
	guard := fence.NewMemory()
	balance := 100

	old, _ := c.Locker().Lock(ctx, "account-7")
	_ = old.Release(ctx) // as if its lease had expired while it was paused
	next, _ := c.Locker().Lock(ctx, "account-7")
	defer next.Release(ctx)

	err := guard.Do(ctx, next, func() error { balance = 150; return nil })
	fmt.Println("newer holder:", err)
	err = guard.Do(ctx, old, func() error { balance = 90; return nil })
	fmt.Println("older holder stale:", errors.Is(err, fence.ErrStale))
	var se *fence.StaleError
	if errors.As(err, &se) {
		fmt.Printf("%q: token %d refused, %d has written\n", se.Name, se.Token, se.Newest)
	}
	fmt.Println("balance:", balance)
	// Output:
	// newer holder: <nil>
	// older holder stale: true
	// "account-7": token 1 refused, 2 has written
	// balance: 150
}

// Leases without fencing tokens (amqpsem's) are refused before any I/O.
func ExampleCheck() {
	_, _, err := fence.Check("mine", fence.Token("job", 0))
	fmt.Println(errors.Is(err, fence.ErrNoToken))
	// Output: true
}
