package natsputex_test

// Holders in processes of their own (contracttest.Main), paused and
// resumed.

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/latchkey-go/latchkey/natsputex"
)

// TestResumedHolderLosesToConfirmingTaker: a holder process (suite
// timing, T = 300ms) is paused with SIGSTOP; a waiter with R = 50ms,
// F = 2, C = 6 takes its key over and, 100ms into its confirmation, the
// holder is resumed. The holder's renewal, at its old revision, must fail
// and end its lease; the waiter's lease, granted with a greater token,
// must stay live for the next 500ms (the resumed holder did not win the
// key back nor make the waiter lose it).
func TestResumedHolderLosesToConfirmingTaker(t *testing.T) {
	url, bucket := promiseEnv(t, "paused")
	h := &harness{urls: url, bucket: bucket}
	p, token, _ := contracttest.StartHolder(t, h.ChildEnv(), "job")
	defer p.Stop()
	for range 3 {
		if _, ok := p.Next(5 * time.Second); !ok {
			t.Fatal("the holder process said nothing")
		}
	}
	waiter := newTestClient(t, url, bucket, natsputex.WithHolderID("taker"),
		natsputex.WithRenewInterval(50*time.Millisecond), natsputex.WithFailureThreshold(2), natsputex.WithConfirmations(6))
	takeover := make(chan time.Time, 8)
	stop := waiter.Locker().Observe(func(e driver.Event) {
		if e.Kind == driver.EventTakeover {
			select {
			case takeover <- time.Now():
			default:
			}
		}
	})
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	got := make(chan grant, 1)
	go func() {
		l, err := waiter.Locker().Lock(ctx, "job")
		got <- grant{lease: l, err: err}
	}()
	time.Sleep(100 * time.Millisecond)
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	p.Drain(20 * time.Millisecond)
	select {
	case at := <-takeover:
		t.Logf("takeover %v after the pause", at.Sub(paused).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("no takeover within 5s of the pause")
	}
	time.Sleep(100 * time.Millisecond)
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	lines := p.ResumedWrites(t)
	t.Logf("the resumed holder wrote %d time(s): %q", len(lines), lines)
	g := <-got
	if g.err != nil {
		t.Fatalf("Lock: %v", g.err)
	}
	defer g.lease.Release(context.Background())
	t.Logf("granted %v after the pause, token %d (the holder's %d)", time.Since(paused).Round(time.Millisecond), g.lease.Token(), token)
	if g.lease.Token() <= token {
		t.Errorf("token %d not above the paused holder's %d", g.lease.Token(), token)
	}
	select {
	case <-g.lease.Context().Done():
		t.Errorf("the taker's lease ended after the holder resumed: %v", context.Cause(g.lease.Context()))
	case <-time.After(500 * time.Millisecond):
	}
}

// TestPausedHolderTakenByTryLockAfterT: a holder process (suite timing: R =
// 100ms, F = 3) paused with SIGSTOP; a TryLock loop of the test's, which
// by the server's clock may take a key silent for T at once, takes its
// key no sooner than T after the holder's last write (the server's
// stamps) and with a greater token. Resumed, the holder's lease ends at
// once with ErrLost, writing at most the one write it had begun.
func TestPausedHolderTakenByTryLockAfterT(t *testing.T) {
	url, bucket := promiseEnv(t, "paused")
	writes := watchWrites(t, url, bucket, "job")
	h := &harness{urls: url, bucket: bucket}
	p, token, _ := contracttest.StartHolder(t, h.ChildEnv(), "job")
	defer p.Stop()
	for range 3 {
		if _, ok := p.Next(5 * time.Second); !ok {
			t.Fatal("the holder process said nothing")
		}
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	p.Drain(50 * time.Millisecond)
	c := newTestClient(t, url, bucket)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got time.Duration
	var tok uint64
	for time.Since(paused) < 3*time.Second {
		l, err := c.Locker().TryLock(ctx, "job")
		if err == nil {
			got = time.Since(paused)
			tok = l.Token()
			defer l.Release(context.Background())
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got == 0 {
		t.Fatal("TryLock never took the paused holder's key")
	}
	t.Logf("TryLock took the paused holder's key %v after the SIGSTOP (token %d, the holder's %d)", got.Round(time.Millisecond), tok, token)
	if tok <= token {
		t.Errorf("token %d not above the paused holder's %d", tok, token)
	}
	writes.mu.Lock()
	var holderVal string
	for _, w := range writes.writes {
		if w.rev == token {
			holderVal = w.value
		}
	}
	writes.mu.Unlock()
	silence(t, writes, holderVal, testF*testR)
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	lines := p.ResumedWrites(t)
	t.Logf("the resumed holder wrote %d time(s) before its lease ended", len(lines))
}

// The environment of a holder process the suite starts (PausedHolder):
// the parent's servers and bucket.
const (
	childURLsEnv   = "NATSPUTEX_TEST_URLS"
	childBucketEnv = "NATSPUTEX_TEST_BUCKET"
)

func TestMain(m *testing.M) { contracttest.Main(m, newChildLocker) }

var _ contracttest.ProcessHarness = (*harness)(nil)

// ChildEnv lets a holder process reach the harness's servers and bucket;
// it uses the suite's timing (testR, testF, testC).
func (h *harness) ChildEnv() []string {
	return []string{childURLsEnv + "=" + h.urls, childBucketEnv + "=" + h.bucket}
}

// newChildLocker is the Locker of a holder process, as NewClient makes it.
func newChildLocker(ctx context.Context) (locks.Locker, func() error, error) {
	h := &harness{
		urls:   os.Getenv(childURLsEnv),
		bucket: os.Getenv(childBucketEnv),
		opts: []natsputex.Option{
			natsputex.WithRenewInterval(testR),
			natsputex.WithFailureThreshold(testF),
			natsputex.WithConfirmations(testC),
		},
	}
	c, err := h.NewClient(ctx)
	if err != nil {
		return nil, nil, err
	}
	return c.Locker(), func() error { return c.Close(context.Background()) }, nil
}
