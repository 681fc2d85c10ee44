package redlockprio_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// Three independent masters; a lease needs two of them. The work runs
// under the lease's context, which ends if the lease is lost or taken.
func ExampleNew() {
	var masters []*redis.Client
	for _, addr := range []string{"127.0.0.1:6379", "127.0.0.1:6380", "127.0.0.1:6381"} {
		rc := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
		defer rc.Close()
		masters = append(masters, rc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := redlockprio.New(masters, redlockprio.WithTTL(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)

	lease, err := c.Locker().Lock(ctx, "reports")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	// Work under lease.Context(); pass lease.Token() to the storage so
	// that it can refuse stale writers.
	work := func(ctx context.Context, token uint64) error {
		fmt.Println("token", token)
		return ctx.Err()
	}
	if err := work(lease.Context(), lease.Token()); err != nil {
		log.Print(err)
	}
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
	high, err := interactive.Locker().Lock(ctx, "index") // returns once low has let go
	if err != nil {
		log.Fatal(err)
	}
	defer high.Release(ctx)
	<-low.Context().Done()
	fmt.Println(context.Cause(low.Context()))
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
	fmt.Println("slot", lease.(locks.SlotLease).Slot())
}
