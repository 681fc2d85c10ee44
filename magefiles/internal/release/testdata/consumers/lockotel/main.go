// A user of lockotel: any Locker wrapped with OpenTelemetry (here the
// in-memory one, with the global no-op providers). It needs no broker
// and gets only locks and the OpenTelemetry API.
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/latchkey-go/latchkey/lockotel"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

func main() {
	ctx := context.Background()
	c, err := memlock.New().NewClient()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)
	l := lockotel.WrapLocker(c.Locker())
	lease, err := l.Lock(ctx, "release-check")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("lockotel: locked release-check, token", lease.Token())
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("lockotel: released")
}
