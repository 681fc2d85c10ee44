package natsputex_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/natsputex"
)

// The package's quick start: a lock on a key of the bucket "locks", on
// the local NATS server.
func ExampleNew() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL, natsputex.ConnectOptions()...)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	client, err := natsputex.New(ctx, js, "locks") // makes the bucket if missing
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx) // ends and releases every lease of the client

	lease, err := client.Locker().Lock(ctx, "nightly-report") // waits its turn
	if err != nil {
		log.Fatal(err) // holds nothing; matches ctx.Err() when ctx ended
	}
	defer lease.Release(ctx)
	// lease.Context() ends if the lock is lost; the token fences stale writers.
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

// Leader election: of all the agents running this, at most one runs the
// service at a time.
func ExampleClient_Supervisor() {
	nc, err := nats.Connect(nats.DefaultURL, natsputex.ConnectOptions()...)
	if err != nil {
		log.Print(err)
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// A real agent runs until SIGTERM; this one stops once its service
	// has started.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := natsputex.New(ctx, js, "locks",
		natsputex.WithRenewInterval(100*time.Millisecond), // R
		natsputex.WithFailureThreshold(3),                 // F: T = 300ms
		natsputex.WithConfirmations(1),                    // C
	)
	if err != nil {
		log.Print(err)
		return
	}
	defer client.Close(context.Background())
	sup, err := client.Supervisor(fmt.Sprintf("example-service-%d", time.Now().UnixNano()), "this-host", natsputex.Service{
		Start: func(_ context.Context, token uint64) error {
			fmt.Println("start the service, fenced:", token > 0)
			cancel()
			return nil
		},
		Stop: func(context.Context) error { fmt.Println("stop the service"); return nil },
	})
	if err != nil {
		log.Print(err)
		return
	}
	_ = sup.Run(ctx) // returns when ctx ends, the service stopped and the key blanked
	// Run stops the service first, in case it ran before this agent
	// held the key.

	// Output:
	// stop the service
	// start the service, fenced: true
	// stop the service
}
