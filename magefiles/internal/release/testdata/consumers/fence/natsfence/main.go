// A user of natsfence: a fenced Put on a bucket of the local NATS server;
// a smaller token is refused.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/natsfence"
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
	bucket := fmt.Sprintf("release-check-%d", time.Now().UnixNano())
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Storage: jetstream.MemoryStorage})
	if err != nil {
		log.Fatal(err)
	}
	defer js.DeleteKeyValue(ctx, bucket)
	g, err := natsfence.New(kv)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := g.Put(ctx, fence.Token("job", 2), "state", []byte("new")); err != nil {
		log.Fatal(err)
	}
	_, err = g.Put(ctx, fence.Token("job", 1), "state", []byte("old"))
	if !errors.Is(err, fence.ErrStale) {
		log.Fatalf("a stale write: got %v, want fence.ErrStale", err)
	}
	fmt.Println("natsfence: stale write refused:", err)
}
