package amqpsem

import (
	"context"
	"time"
)

// scanCloseWait bounds the close of a scan's connection; past it, the
// socket is closed under the AMQP close.
const scanCloseWait = 2 * time.Second

// prober returns the prober of a's probes: the scan's connection's within
// scanning, else the session's.
func (a *Admin) prober() *prober {
	if a.scan != nil {
		return a.scan
	}
	return a.c.probes
}

// scanning runs scan with a copy of a (bound) whose probes go over a
// connection of their own, dialled with the client's URL and connection
// options and closed when scan returns. A full scan publishes tens of
// thousands of probes, which take seconds on a loaded machine; on the
// client's connection, the verification probes of the client's leases
// (the administration mutex's among them) would queue behind them, and a
// lease could reach the end of its validity without a renewal: a false
// loss. Everything else the copy does (the mutex, declares, deletes, wake-
// ups) stays on the client's connection.
//
// When the connection cannot be dialled, scan runs on the client's
// connection, as it did before scans had their own: the answer is the
// same, only the client's leases may be renewed late (an extra connection
// refused by a connection limit must not make statuses fail). When ctx
// ends during the dial, scanning returns the dial's error, which matches
// ctx.Err(). When the client's connection goes away during the scan, the
// scan is stopped and its error is the client's; when the scan's own
// connection goes away, the scan fails (it is not made again on the
// client's).
func (a *Admin) scanning(ctx context.Context, scan func(ctx context.Context, b *Admin) error) error {
	s, err := dialSession(ctx, a.cl)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		return scan(ctx, a)
	}
	s.start()
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), scanCloseWait)
		defer cancel()
		_ = s.close(cctx)
	}()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-a.c.done:
			stop()
		case <-sctx.Done():
		}
	}()
	b := *a
	b.scan = s.probes
	err = scan(sctx, &b)
	if err != nil && ctx.Err() == nil {
		if cerr := a.c.errClosed(); cerr != nil {
			return cerr
		}
		if s.errClosed() != nil {
			return errorf("amqpsem: the scan's own connection was lost: %w", err)
		}
	}
	return err
}

// heldRange is heldBetween, over a connection of its own (see scanning)
// when the range is more than one sweep batch.
func (a *Admin) heldRange(ctx context.Context, name string, lo, hi int) ([]int, error) {
	if hi-lo+1 <= sweepBatch || a.scan != nil {
		return a.heldBetween(ctx, name, lo, hi)
	}
	var held []int
	err := a.scanning(ctx, func(ctx context.Context, a *Admin) error {
		var err error
		held, err = a.heldBetween(ctx, name, lo, hi)
		return err
	})
	return held, err
}
