// A user of amqpsem: a mutex (one exclusive queue) on the local RabbitMQ.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := amqpsem.Dial(ctx, "amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)
	m := c.Locker()
	name := fmt.Sprintf("release-check-%d", time.Now().UnixNano())
	lease, err := m.Lock(ctx, name)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("amqpsem: locked", name)
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("amqpsem: released")
}
