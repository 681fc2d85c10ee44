// A user of redisfence: a fenced SET on the local Redis; a smaller token
// is refused.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/redisfence"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer rc.Close()
	g, err := redisfence.New(rc)
	if err != nil {
		log.Fatal(err)
	}
	name := fmt.Sprintf("release-check-%d", time.Now().UnixNano())
	if err := g.Set(ctx, fence.Token(name, 2), name+":data", "new"); err != nil {
		log.Fatal(err)
	}
	err = g.Set(ctx, fence.Token(name, 1), name+":data", "old")
	if !errors.Is(err, fence.ErrStale) {
		log.Fatalf("a stale write: got %v, want fence.ErrStale", err)
	}
	fmt.Println("redisfence: stale write refused:", err)
	rc.Del(ctx, name+":data", g.FenceKey(name, name+":data"))
}
