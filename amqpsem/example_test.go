package amqpsem_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// An administrator creates a semaphore with two slots; workers take
// slots; removing a slot leaves its holder in place until it lets go.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := amqpsem.Dial(ctx, "amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Print(err) // no broker here
		return
	}
	defer c.Close()

	admin, _ := c.Admin()
	if err := admin.Create(ctx, "example-builds", 2); err != nil {
		log.Fatal(err)
	}
	defer admin.Destroy(ctx, "example-builds")

	sem, _ := c.Semaphore()
	lease, err := sem.Acquire(ctx, "example-builds")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding slot", lease.(*amqpsem.Lease).Slot())
	// Work under lease.Context(): it ends if the slot is lost.
	_ = lease.Release(ctx)
}

// A mutex on one exclusive queue; Lock waits for a release.
func ExampleMutex() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := amqpsem.Dial(ctx, "amqp://guest:guest@127.0.0.1:5672/",
		amqpsem.WithHeartbeat(5*time.Second)) // a crashed holder is gone within 10-15s
	if err != nil {
		log.Print(err)
		return
	}
	defer c.Close()
	m, _ := c.Mutex()
	lease, err := m.Lock(ctx, "example-migrations")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	fmt.Println("token", lease.Token()) // no fencing tokens on RabbitMQ
	// Output: token 0
}

// Share a semaphore with the existing Python implementation.
func ExamplePythonLayout() {
	ctx := context.Background()
	c, err := amqpsem.Dial(ctx, "amqp://guest:guest@127.0.0.1:5672/",
		amqpsem.WithLayout(amqpsem.PythonLayout))
	if err != nil {
		log.Print(err)
		return
	}
	defer c.Close()
	fmt.Println(amqpsem.PythonLayout.Slot("jobs", 1), amqpsem.PythonLayout.Holder("jobs", 1))
	// Output: jobs-A-1 jobs-B-1
}
