package tests

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/lockotel"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// The renewal answers of kitLocker.
const (
	renewOK = iota
	renewFail
	renewLose
)

// kitLocker is a backend built on the driver kit as the real ones are:
// its Registry renews its leases in rounds and reports them, and it
// observes through the Registry. Its "broker" is a map.
type kitLocker struct {
	reg   *driver.Registry
	renew atomic.Int32
	mu    sync.Mutex
	held  map[string]bool
}

func newKitLocker(t testing.TB) *kitLocker {
	k := &kitLocker{held: make(map[string]bool)}
	reg, err := driver.NewRegistry(driver.Config{Backend: "kit", RenewEvery: 20 * time.Millisecond, Renew: k.renewBatch})
	if err != nil {
		t.Fatal(err)
	}
	k.reg = reg
	t.Cleanup(func() { _ = reg.Close(context.Background(), nil) })
	return k
}

func (k *kitLocker) renewBatch(_ context.Context, batch []*driver.Lease) []driver.Renewal {
	out := make([]driver.Renewal, len(batch))
	for i := range batch {
		switch k.renew.Load() {
		case renewFail:
			out[i].Err = errors.New("broker busy")
		case renewLose:
			out[i].Err = driver.Lost(errors.New("key gone"))
		default:
			out[i].Until = time.Now().Add(time.Minute)
		}
	}
	return out
}

func (k *kitLocker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	return k.TryLock(ctx, name)
}

func (k *kitLocker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.held[name] {
		return nil, &locks.HeldError{Name: name}
	}
	l, err := k.reg.NewLease(ctx, driver.Spec{
		Name: name, Token: 1, Deadline: time.Now().Add(time.Minute),
		Release: func(context.Context) error {
			k.mu.Lock()
			delete(k.held, name)
			k.mu.Unlock()
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	k.held[name] = true
	return l.Handle(), nil
}

func (k *kitLocker) Observe(fn func(driver.Event)) func() { return k.reg.Observe(fn) }

// The kit's own events (renewal rounds and failures) reach the metrics,
// and leases that the kit ends are counted by cause: lost on a renewal
// that finds the lease gone, closed when the client closes.
func TestKitEvents(t *testing.T) {
	tl := newTelemetry(t)
	k := newKitLocker(t)
	l := lockotel.WrapLocker(k, tl.opts()...)
	defer l.StopEvents()
	ctx := tl.ctx

	lost, err := l.Lock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	checkAttrs(t, tl.lastSpan(t, "latchkey.lock"), backend("tests"))
	eventually(t, within, "no renewal round recorded", func() bool {
		n, _ := tl.hist(t, "latchkey.renew.duration", backend("tests"))
		return n >= 1
	})
	k.renew.Store(renewFail)
	eventually(t, within, "no renewal failure recorded", func() bool {
		return tl.sum(t, "latchkey.renew.failures") >= 1
	})
	if lost.Context().Err() != nil {
		t.Fatalf("a failed renewal ended the lease: %v", context.Cause(lost.Context()))
	}
	k.renew.Store(renewLose)
	<-lost.Context().Done()
	eventually(t, within, "lease end with cause lost not recorded", func() bool {
		return tl.sum(t, "latchkey.lease.ends", cause("lost")) == 1
	})
	_ = lost.Release(ctx)

	k.renew.Store(renewOK)
	closed, err := l.Lock(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := k.reg.Close(ctx, nil); err != nil {
		t.Fatal(err)
	}
	<-closed.Context().Done()
	eventually(t, within, "lease end with cause closed not recorded", func() bool {
		return tl.sum(t, "latchkey.lease.ends", cause("closed")) == 1
	})
	if got := tl.sum(t, "latchkey.leases.held"); got != 0 {
		t.Errorf("leases held = %d", got)
	}
}
