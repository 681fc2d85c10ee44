// A user of locks alone: code that takes a locks.Locker, tested with the
// in-memory backend. It needs no broker.
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/latchkey-go/latchkey/locks/memlock"
)

func main() {
	ctx := context.Background()
	c, err := memlock.New().NewClient()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)
	l := c.Locker()
	lease, err := l.Lock(ctx, "release-check")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("locks: locked release-check, token", lease.Token())
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("locks: released")
}
