package natsputex_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
)

// TestAttackPausedHolderTryLock: a holder process (suite timing: R =
// 100ms, F = 3) paused with SIGSTOP; a TryLock loop of the test's, which
// by the server's clock may take a key silent for T at once, takes its
// key no sooner than T after the holder's last write (the server's
// stamps) and with a greater token. Resumed, the holder's lease ends at
// once with ErrLost, writing at most the one write it had begun.
func TestAttackPausedHolderTryLock(t *testing.T) {
	url, bucket := promiseEnv(t, "atkpaused")
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
