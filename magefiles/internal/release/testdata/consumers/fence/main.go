// A user of fence alone: a write guarded in process (fence.Memory) by
// memlock leases; a stale holder's write is refused. It needs no server.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/sqlfence"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

func main() {
	ctx := context.Background()
	c, err := memlock.New().NewClient()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)
	guard := fence.NewMemory()
	first, err := c.Locker().Lock(ctx, "release-check")
	if err != nil {
		log.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		log.Fatal(err)
	}
	second, err := c.Locker().Lock(ctx, "release-check")
	if err != nil {
		log.Fatal(err)
	}
	defer second.Release(ctx)
	if err := guard.Do(ctx, second, func() error { return nil }); err != nil {
		log.Fatal(err)
	}
	err = guard.Do(ctx, first, func() error { return nil })
	if !errors.Is(err, fence.ErrStale) {
		log.Fatalf("a stale write: got %v, want fence.ErrStale", err)
	}
	fmt.Println("fence: stale write refused:", err)
	if _, err := sqlfence.New(sqlfence.Postgres); err != nil {
		log.Fatal(err)
	}
	fmt.Println("fence: sqlfence guard made")
}
