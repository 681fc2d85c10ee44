// A user of redlockprio: a lease on one local Redis master.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/redlockprio"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer rc.Close()
	c, err := redlockprio.New([]*redis.Client{rc})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)
	l := c.Locker()
	name := fmt.Sprintf("release-check-%d", time.Now().UnixNano())
	lease, err := l.Lock(ctx, name)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("redlockprio: locked", name, "token", lease.Token())
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("redlockprio: released")
}
