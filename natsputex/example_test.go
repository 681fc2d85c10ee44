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

// A lock on a key of the bucket "locks", on the local NATS server.
func Example() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Print(err) // no local NATS server
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	client, err := natsputex.New(ctx, js, "locks", natsputex.WithRenewInterval(500*time.Millisecond))
	if err != nil {
		log.Print(err)
		return
	}
	defer client.Close(ctx)

	lease, err := client.Locker().Lock(ctx, "nightly-report")
	if err != nil {
		log.Print(err)
		return
	}
	defer lease.Release(ctx)
	// Work under lease.Context(): it ends if the lock is lost. Pass
	// lease.Token() to the storage the report writes to.
	if err := writeReport(lease.Context(), lease.Token()); err != nil {
		log.Print(err)
	}
}

// writeReport stands for work done under a lease: it stops when ctx ends
// and hands token to the storage it writes to.
func writeReport(ctx context.Context, token uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fmt.Println("holding nightly-report, token > 0:", token > 0)
	return nil
}

// Leader election: of all the agents running this, at most one runs the
// service at a time.
func ExampleClient_Supervisor() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Print(err)
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// Stop after a second: a real agent runs until SIGTERM.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
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
		Start: func(context.Context, uint64) error { fmt.Println("start the service"); return nil },
		Stop:  func(context.Context) error { return nil },
	})
	if err != nil {
		log.Print(err)
		return
	}
	_ = sup.Run(ctx) // returns when ctx ends, the service stopped and the key blanked
}
