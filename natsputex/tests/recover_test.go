package natsputex_test

import (
	"context"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestFreshLockTakesSilentKey: a process that starts after a holder crashed
// and its key has gone T without a write (by the server's clock) takes the
// key over at once, with only the C confirmation intervals, instead of
// watching it for a full T of its own first. (TryLock does the same: see
// the conformance suite's TryLockRecoversCrash.)
func TestFreshLockTakesSilentKey(t *testing.T) {
	const (
		r = 500 * time.Millisecond
		f = 3
		c = 1
		T = f * r
	)
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("fresh")
	prepareBucket(t, url, bucket)
	opts := []natsputex.Option{natsputex.WithRenewInterval(r), natsputex.WithFailureThreshold(f), natsputex.WithConfirmations(c)}

	nc, js, err := connect(url)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := natsputex.New(context.Background(), js, bucket, opts...)
	if err != nil {
		t.Fatal(err)
	}
	held, err := holder.Locker().TryLock(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	nc.Close() // the holder crashes: no release, no renewal
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	time.Sleep(T + r) // longer than T since its last write

	fresh := newTestClient(t, url, bucket, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	lease, err := fresh.Locker().Lock(ctx, "job")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	defer lease.Release(context.Background())
	t.Logf("a fresh Lock took a key silent for %v after %v (T = %v, C·R = %v)", T+r, took.Round(time.Millisecond), T, c*r)
	if took >= T {
		t.Fatalf("a fresh Lock took %v to take a key already silent for %v: it watched the key for T = %v itself", took.Round(time.Millisecond), T+r, T)
	}
	if lease.Token() <= held.Token() {
		t.Errorf("token %d not above the crashed holder's %d", lease.Token(), held.Token())
	}
}
