package redlockprio_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// The package's quick start: three independent masters; a lease needs
// two of them.
func ExampleNew() {
	ctx := context.Background()
	addrs := []string{"127.0.0.1:6379"} // independent masters: 1, 3 or 5
	var masters []*redis.Client
	for _, addr := range addrs {
		rc := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
		defer rc.Close()
		masters = append(masters, rc)
	}
	client, err := redlockprio.New(masters) // no I/O yet
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx) // ends and releases every lease of the client

	lease, err := client.Locker().Lock(ctx, "nightly-report") // waits its turn
	if err != nil {
		log.Fatal(err) // holds nothing; matches ctx.Err() when ctx ended
	}
	defer lease.Release(ctx)
	// lease.Context() ends if the lock is lost or taken; the token fences stale writers.
	if err := doWork(lease.Context(), lease.Token()); err != nil {
		log.Print(err)
	}
	// Output: working, fenced: true
}

// doWork stands for your own work under a lease: it stops when ctx ends
// and passes token to the storage it writes to.
func doWork(ctx context.Context, token uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fmt.Println("working, fenced:", token > 0)
	return nil
}

// A higher priority takes the name from a lower one, which learns it from
// its lease's context.
func ExampleWithPriority() {
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer rc.Close()
	ctx := context.Background()
	batch, _ := redlockprio.New([]*redis.Client{rc}, redlockprio.WithPriority(1))
	defer batch.Close(ctx)
	interactive, _ := redlockprio.New([]*redis.Client{rc}, redlockprio.WithPriority(10))
	defer interactive.Close(ctx)

	low, err := batch.Locker().Lock(ctx, "index")
	if err != nil {
		log.Fatal(err)
	}
	// The batch job works under its lease's context, and lets go when it
	// ends: its Release tells the thief it may start.
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-low.Context().Done() // taken by a higher priority
		fmt.Println("batch:", errors.Is(context.Cause(low.Context()), locks.ErrPreempted))
		_ = low.Release(ctx)
	}()
	high, err := interactive.Locker().Lock(ctx, "index") // returns once low has let go
	if err != nil {
		log.Fatal(err)
	}
	<-stopped
	fmt.Println("interactive holds the lock")
	_ = high.Release(ctx)
	// Output:
	// batch: true
	// interactive holds the lock
}

// Two slots per name.
func ExampleClient_Semaphore() {
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer rc.Close()
	ctx := context.Background()
	c, _ := redlockprio.New([]*redis.Client{rc})
	defer c.Close(ctx)
	sem, _ := c.Semaphore(2)
	lease, err := sem.Acquire(ctx, "encoders")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	slot := lease.(locks.SlotLease).Slot() // 1 or 2: tried from a random one
	fmt.Println("holding one of 2 slots:", slot == 1 || slot == 2)
	// Output: holding one of 2 slots: true
}
