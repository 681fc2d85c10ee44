package lockotel_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/latchkey-go/latchkey/lockotel"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// Wrap a backend's Locker and use the wrapper in its place. Here the
// global providers are OpenTelemetry's no-op defaults; an application
// installs the SDK (otel.SetTracerProvider, otel.SetMeterProvider) or
// passes its providers with WithTracerProvider and WithMeterProvider.
func Example() {
	store := memlock.New()
	client, _ := store.NewClient()
	defer client.Close(context.Background())
	locker := lockotel.WrapLocker(client.Locker(), lockotel.WithBackend("memlock"))
	defer locker.StopEvents()
	ctx := context.Background()

	// A span "latchkey.lock" and the wait and acquisition metrics.
	lease, err := locker.Lock(ctx, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	// Work under lease.Context(): it ends if the lease is lost.
	fmt.Println("token", lease.Token())

	// A span "latchkey.release"; the hold time and the cause "released".
	fmt.Println("release:", lease.Release(ctx))
	fmt.Println("cause:", context.Cause(lease.Context()))
	// Output:
	// token 1
	// release: <nil>
	// cause: locks: lease released
}

// A wrapped Semaphore's leases keep their slot, and Unwrap returns the
// backend's own lease.
func ExampleWrapSemaphore() {
	store := memlock.New()
	client, _ := store.NewClient()
	defer client.Close(context.Background())
	sem, _ := client.Semaphore(2)
	wrapped := lockotel.WrapSemaphore(sem)
	ctx := context.Background()

	a, _ := wrapped.Acquire(ctx, "workers")
	b, _ := wrapped.TryAcquire(ctx, "workers")
	_, err := wrapped.TryAcquire(ctx, "workers") // the span's outcome: not_acquired
	fmt.Println(a.(locks.SlotLease).Slot(), b.(locks.SlotLease).Slot(), errors.Is(err, locks.ErrNotAcquired))

	inner := a.(interface{ Unwrap() locks.Lease }).Unwrap()
	fmt.Println(inner.Token() == a.Token())
	_ = a.Release(ctx)
	_ = b.Release(ctx)
	// Output:
	// 1 2 true
	// true
}

// With WithHashedNames, spans and metrics show this hash of a name.
func ExampleHashName() {
	fmt.Println(lockotel.HashName("nightly-report"))
	// Output: 6743ba10a2b2c487
}
