// A user of natsputex: a lock on a key of a JetStream KV bucket on the
// local NATS server.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/natsputex"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	client, err := natsputex.New(ctx, js, "latchkey-release-check")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
	name := fmt.Sprintf("release-check-%d", time.Now().UnixNano())
	lease, err := client.Locker().Lock(ctx, name)
	if err != nil {
		log.Fatal(err)
	}
	// The work runs under lease.Context(): it ends if the lock is lost.
	if err := lease.Context().Err(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("natsputex: locked", name, "token", lease.Token())
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("natsputex: released")
}
