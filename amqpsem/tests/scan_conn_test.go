package amqpsem_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// scanDialer counts the connections a client dials; with refuse, it
// refuses every connection after the first (the client's own).
type scanDialer struct {
	attempts atomic.Int64
	refuse   bool
}

func (d *scanDialer) option() amqpsem.Option {
	return amqpsem.WithDial(func(ctx context.Context, network, addr string) (net.Conn, error) {
		if n := d.attempts.Add(1); d.refuse && n > 1 {
			return nil, errors.New("scanDialer: refused")
		}
		var nd net.Dialer
		return nd.DialContext(ctx, network, addr)
	})
}

// scanClient dials a client through d with a 1s heartbeat and a 100ms
// verify interval, creates a semaphore of 3 slots and returns an Admin of
// the client, the semaphore's name and a lease of one of its slots held by
// the same client.
func scanClient(t *testing.T, ctx context.Context, d *scanDialer) (*amqpsem.Admin, string, *amqpsem.Lease) {
	t.Helper()
	url, _ := amqpURL(t)
	name := atkName("scanconn")
	atkCleanup(t, url, name)
	c, err := amqpsem.Dial(ctx, url, append(testOptions(),
		amqpsem.WithHeartbeat(time.Second), amqpsem.WithVerifyInterval(100*time.Millisecond), d.option())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	a := atkAdmin(t, c)
	if err := a.Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	sem, err := c.Semaphore(3)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sem.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return a, name, l.(*amqpsem.Lease)
}

// scanRound runs a Status and a WaitReleased of name at once, on a, and
// checks their answers: the semaphore has 3 slots, slot is held, nothing
// removed is held.
func scanRound(t *testing.T, ctx context.Context, a *amqpsem.Admin, name string, slot int) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Go(func() {
		st, err := a.Status(ctx, name)
		switch {
		case err != nil:
			t.Errorf("Status: %v", err)
		case st.Slots != 3 || !slices.Equal(st.Held, []int{slot}) || len(st.Removed) > 0:
			t.Errorf("Status = %+v, want 3 slots, slot %d held, none removed", st, slot)
		}
	})
	wg.Go(func() {
		if err := a.WaitReleased(ctx, name); err != nil {
			t.Errorf("WaitReleased: %v", err)
		}
	})
	wg.Wait()
}

// TestStatusScansKeepLeasesLive: a client holds a slot with a 1s heartbeat
// and a 100ms verify interval while its own Admin runs Status and
// WaitReleased, each of which probes every slot number (65535 probes),
// round after round. The scans' probes go over connections of their own
// (one dialled per scan), so the lease's verifications, and the
// administration mutex's during WaitReleased's check, are not queued
// behind them: the lease stays live throughout, and every wait returns
// nil.
func TestStatusScansKeepLeasesLive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 28*time.Second)
	defer cancel()
	var d scanDialer
	a, name, lease := scanClient(t, ctx, &d)
	before := d.attempts.Load()
	start := time.Now()
	rounds := 0
	for rounds < 3 && (rounds < 1 || time.Since(start) < 6*time.Second) {
		scanRound(t, ctx, a, name, lease.Slot())
		rounds++
		if err := context.Cause(lease.Context()); err != nil {
			t.Fatalf("lease lost after %d rounds of scans (%v): %v", rounds, time.Since(start), err)
		}
		if t.Failed() {
			return
		}
	}
	t.Logf("%d rounds of a Status and a WaitReleased at once in %v", rounds, time.Since(start))
	if got, want := d.attempts.Load()-before, int64(2*rounds); got < want {
		t.Errorf("%d connections dialled for %d scans: the scans' probes did not go over connections of their own", got, want)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("release after the scans: %v", err)
	}
}

// TestStatusScanDialRefused: when the scan's own connection cannot be
// dialled, Status and WaitReleased fall back on the client's connection
// and answer as they would on their own.
func TestStatusScanDialRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 28*time.Second)
	defer cancel()
	d := scanDialer{refuse: true}
	a, name, lease := scanClient(t, ctx, &d)
	before := d.attempts.Load()
	scanRound(t, ctx, a, name, lease.Slot())
	if got := d.attempts.Load() - before; got < 2 {
		t.Errorf("%d connection attempts for 2 scans, want at least 2", got)
	}
}
