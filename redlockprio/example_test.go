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

// Three independent masters; a lease needs two of them.
func ExampleNew() {
	var masters []redis.UniversalClient
	for _, addr := range []string{"127.0.0.1:6379", "127.0.0.1:6380", "127.0.0.1:6381"} {
		rc := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer rc.Close()
		masters = append(masters, rc)
	}
	l, err := redlockprio.New(masters, redlockprio.WithTTL(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := l.Lock(ctx, "reports")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.Background())
	// Work under lease.Context(): it ends if the lease is lost or taken.
	// Pass lease.Token() to the storage so it can refuse stale writers.
	fmt.Println("token", lease.Token())
}

// A higher priority takes the name from a lower one, which learns it from
// its lease's context.
func ExampleWithPriority() {
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer rc.Close()
	batch, _ := redlockprio.New([]redis.UniversalClient{rc}, redlockprio.WithPriority(1))
	defer batch.Close()
	interactive, _ := redlockprio.New([]redis.UniversalClient{rc}, redlockprio.WithPriority(10))
	defer interactive.Close()

	ctx := context.Background()
	low, err := batch.Lock(ctx, "index")
	if err != nil {
		log.Fatal(err)
	}
	high, err := interactive.Lock(ctx, "index") // returns once low has let go
	if err != nil {
		log.Fatal(err)
	}
	defer high.Release(ctx)
	<-low.Context().Done()
	fmt.Println(context.Cause(low.Context()))
}

// Two slots per name.
func ExampleLocker_Semaphore() {
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer rc.Close()
	l, _ := redlockprio.New([]redis.UniversalClient{rc})
	defer l.Close()
	sem, _ := l.Semaphore(2)
	lease, err := sem.Acquire(context.Background(), "encoders")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.Background())
	fmt.Println("slot", lease.(locks.SlotLease).Slot())
}
