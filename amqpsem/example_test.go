package amqpsem_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// The package's quick start: a lock on the local RabbitMQ.
func ExampleDial() {
	ctx := context.Background()
	client, err := amqpsem.Dial(ctx, "amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx) // ends and releases every lease of the client

	lease, err := client.Locker().Lock(ctx, "nightly-report") // waits its turn
	if err != nil {
		log.Fatal(err) // holds nothing; matches ctx.Err() when ctx ended
	}
	defer lease.Release(ctx)
	// lease.Context() ends if the lock is lost (no fencing token: Token() is 0).
	if err := doWork(lease.Context()); err != nil {
		log.Print(err)
	}
	// Output: working
}

// doWork stands for your own work under a lease: it stops when ctx ends.
func doWork(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fmt.Println("working")
	return nil
}

// A client dialed WithCreate: Semaphore(2) creates the persistent
// semaphore with two slots on first use, and never takes more than two.
// Work runs under lease.Context(), which ends if the slot is lost.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := amqpsem.Dial(ctx, "amqp://guest:guest@127.0.0.1:5672/", amqpsem.WithCreate(true))
	if err != nil {
		log.Print(err) // no broker here
		return
	}
	defer c.Close(ctx)

	sem, err := c.Semaphore(2)
	if err != nil {
		log.Fatal(err)
	}
	lease, err := sem.Acquire(ctx, "example-builds")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	build(lease.Context(), lease.(*amqpsem.Lease).Slot())
	// Output: built on slot 1
}

// build stands for work that stops when ctx ends.
func build(ctx context.Context, slot int) {
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Millisecond):
		fmt.Println("built on slot", slot)
	}
}

// An administrator creates a semaphore with two slots; removing a slot
// leaves its holder in place until it lets go.
func ExampleAdmin() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := amqpsem.Dial(ctx, "amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Print(err) // no broker here
		return
	}
	defer c.Close(ctx)

	admin, _ := c.Admin()
	if err := admin.Create(ctx, "example-jobs", 2); err != nil {
		log.Fatal(err)
	}
	defer admin.Destroy(ctx, "example-jobs")

	// MaxSemaphoreSize: take any slot the broker has, whatever C is.
	sem, _ := c.Semaphore(amqpsem.MaxSemaphoreSize)
	lease, err := sem.Acquire(ctx, "example-jobs")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	if _, err := admin.Remove(ctx, "example-jobs", 1); err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding slot", lease.(*amqpsem.Lease).Slot(), "of a semaphore of 1")
	// Output: holding slot 1 of a semaphore of 1
}

// A mutex on one exclusive queue; Lock waits for a release.
func ExampleLocker() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := amqpsem.Dial(ctx, "amqp://guest:guest@127.0.0.1:5672/",
		amqpsem.WithHeartbeat(5*time.Second)) // a cut-off holder is gone within 15s
	if err != nil {
		log.Print(err) // no broker here
		return
	}
	defer c.Close(ctx)
	lease, err := c.Locker().Lock(ctx, "example-migrations")
	if err != nil {
		log.Print(err)
		return
	}
	defer lease.Release(ctx)
	// The lock "example-migrations" is the exclusive queue of that name.
	fmt.Println("holding queue", amqpsem.DefaultLayout.Mutex("example-migrations"))
	// Run the migrations under lease.Context(): it ends if the lock is
	// lost. lease.Token() is 0: RabbitMQ has no fencing tokens.
	migrate(lease.Context())

	// Output: holding queue example-migrations
}

// migrate stands for work that stops when ctx ends.
func migrate(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Millisecond):
	}
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
	defer c.Close(ctx)
	// The Locker, Semaphores and Admins of c use the Python
	// implementation's queue names.
	fmt.Println("connected:", c.Connected())

	// Output:
	// jobs-A-1 jobs-B-1
	// connected: true
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
	defer c.Close(ctx)
	fmt.Println("connected:", c.Connected())
	// Output: connected: true
}
