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
	defer c.Close(context.Background())

	admin, _ := c.Admin()
	if err := admin.Create(ctx, "example-builds", 2); err != nil {
		log.Fatal(err)
	}
	defer admin.Destroy(ctx, "example-builds")

	sem, _ := c.Semaphore(amqpsem.MaxSemaphoreSize)
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
	// The mutex "example-migrations" is the exclusive queue of that name.
	fmt.Println("queue", amqpsem.DefaultLayout.Mutex("example-migrations"))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := amqpsem.Dial(ctx, "amqp://guest:guest@127.0.0.1:5672/",
		amqpsem.WithHeartbeat(5*time.Second)) // a cut-off holder is gone within 15s
	if err != nil {
		log.Print(err) // no broker here
		return
	}
	defer c.Close(context.Background())
	m := c.Locker()
	lease, err := m.Lock(ctx, "example-migrations")
	if err != nil {
		log.Print(err)
		return
	}
	defer lease.Release(ctx)
	// Run the migrations under lease.Context(): it ends if the mutex is
	// lost. lease.Token() is 0: RabbitMQ has no fencing tokens.

	// Output: queue example-migrations
}

// Share a semaphore with the existing Python implementation.
func ExamplePythonLayout() {
	fmt.Println(amqpsem.PythonLayout.Slot("jobs", 1), amqpsem.PythonLayout.Holder("jobs", 1))

	ctx := context.Background()
	c, err := amqpsem.Dial(ctx, "amqp://guest:guest@127.0.0.1:5672/",
		amqpsem.WithLayout(amqpsem.PythonLayout))
	if err != nil {
		log.Print(err) // no broker here
		return
	}
	defer c.Close(context.Background())
	// Semaphores, Mutexes and Admins of c use the Python implementation's
	// queue names.

	// Output: jobs-A-1 jobs-B-1
}

// A long-lived client reconnects by itself after a lost connection;
// the notice is its health signal. Leases of the lost connection end
// (their contexts say so): acquire again on the new one.
func ExampleWithConnectionNotice() {
	ctx := context.Background()
	c, err := amqpsem.Dial(ctx, "amqp://guest:guest@127.0.0.1:5672/",
		amqpsem.WithConnectionNotice(func(e amqpsem.ConnectionEvent) {
			switch {
			case e.Up:
				log.Printf("broker connection back after %d attempts", e.Attempt)
			case e.Attempt == 0:
				log.Printf("broker connection lost: %v", e.Err)
			default:
				log.Printf("reconnection attempt %d: %v", e.Attempt, e.Err)
			}
		}))
	if err != nil {
		log.Print(err) // no broker here
		return
	}
	defer c.Close(context.Background())
	fmt.Println("connected:", c.Connected())
}
