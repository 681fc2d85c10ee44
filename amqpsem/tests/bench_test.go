package amqpsem_test

import (
	"context"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/locks"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// BenchmarkFloor is the raw floor of a mutex: an exclusive queue declare
// and delete on one channel.
func BenchmarkFloor(b *testing.B) {
	u, _ := amqpURL(b)
	conn, err := amqp.Dial(u)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q := fmt.Sprintf("amqpsem-floor-%p", b)
	for b.Loop() {
		if _, err := ch.QueueDeclare(q, false, false, true, false, amqp.Table{"x-max-length": int32(0)}); err != nil {
			b.Fatal(err)
		}
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMutex runs the suite's benchmarks on the Mutex.
func BenchmarkMutex(b *testing.B) {
	contracttest.RunBenchmarks(b, newHarness(direct, false))
}

// BenchmarkSemaphoreAcquire measures TryAcquire+Release with some slots
// already held: probes are pipelined, so the cost grows slowly.
func BenchmarkSemaphoreAcquire(b *testing.B) {
	u, _ := amqpURL(b)
	for _, held := range []int{0, 10, 100} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			ctx := context.Background()
			c, err := amqpsem.Dial(ctx, u, testOptions()...)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(context.Background())
			name := fmt.Sprintf("amqpsem-bench-%d-%p", held, b)
			a, _ := c.Admin()
			if err := a.Create(ctx, name, held+1); err != nil {
				b.Fatal(err)
			}
			defer a.Destroy(ctx, name)
			s, _ := c.Semaphore(amqpsem.MaxSemaphoreSize)
			var leases []locks.Lease
			for range held {
				l, err := s.TryAcquire(ctx, name)
				if err != nil {
					b.Fatal(err)
				}
				leases = append(leases, l)
			}
			for b.Loop() {
				l, err := s.TryAcquire(ctx, name)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			for _, l := range leases {
				_ = l.Release(ctx)
			}
		})
	}
}
