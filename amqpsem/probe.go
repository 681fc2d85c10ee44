package amqpsem

import (
	"context"
	"errors"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// maxBatch is the window of probes a scan sends per round trip.
const maxBatch = 128

// sweepBatch bounds the probes in flight at once in one call: a status
// or wait checks every slot number, 65535 probes. Returns are read while
// the confirms are awaited, but not after a caller gave up: the broker
// goes on returning its batch's probes until the next call reads them, so
// the return buffer holds a whole batch. Were it full, the connection's
// reader would wait for it, and every call on the connection with it (a
// mutex's delete after a WaitReleased whose ctx ended mid-check never
// ended).
const sweepBatch = 1024

// prober checks queue existence the way the specification recommends: a
// publish with the mandatory flag on a channel in confirm mode. A queue
// that does not exist makes the broker return the message (NO_ROUTE)
// before it confirms it; a queue that does exists drops the message (its
// x-max-length is 0, and the message expires at once anyway). Probes are
// pipelined: a batch is published, then its confirms awaited together.
// Unlike a passive declare, a missing queue does not close the channel.
type prober struct {
	c   *session
	sem chan struct{} // one batch at a time

	// Guarded by sem.
	ch      *amqp.Channel
	returns chan amqp.Return
	pending []*amqp.DeferredConfirmation // of a batch whose caller gave up
	seq     uint64
}

// exists reports, for each queue, whether it exists. The answers for one
// batch come from the broker in order, but are not atomic: a queue may
// appear or go just after its probe.
func (p *prober) exists(ctx context.Context, queues []string) ([]bool, error) {
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.c.done:
		return nil, p.c.errClosed()
	}
	defer func() { <-p.sem }()
	out := make([]bool, 0, len(queues))
	for len(queues) > 0 {
		n := min(len(queues), sweepBatch)
		got, err := p.batch(ctx, queues[:n])
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
		queues = queues[n:]
	}
	return out, nil
}

// open opens the probe channel in confirm mode, if needed. Opening a
// channel takes no context in amqp: when ctx ends first, open returns
// ctx's error and the channel, once open, is closed again.
func (p *prober) open(ctx context.Context) error {
	if p.ch != nil && !p.ch.IsClosed() {
		return nil
	}
	p.ch, p.pending = nil, nil
	type opened struct {
		ch      *amqp.Channel
		returns chan amqp.Return
		err     error
	}
	res := make(chan opened) // unbuffered: a result nobody takes is closed
	abandon := make(chan struct{})
	ok := p.c.goTracked(func() {
		var o opened
		o.ch, o.err = p.c.channel()
		if o.err == nil {
			if err := o.ch.Confirm(false); err != nil {
				_ = o.ch.Close()
				o.ch, o.err = nil, p.c.connErr(err)
			} else {
				o.returns = o.ch.NotifyReturn(make(chan amqp.Return, sweepBatch))
			}
		}
		select {
		case res <- o:
		case <-abandon:
			if o.ch != nil {
				_ = o.ch.Close()
			}
		}
	})
	if !ok {
		return p.c.errClosed()
	}
	select {
	case o := <-res:
		if o.err != nil {
			return o.err
		}
		p.ch, p.returns = o.ch, o.returns
		return nil
	case <-ctx.Done():
		close(abandon)
		return ctx.Err()
	}
}

func (p *prober) batch(ctx context.Context, queues []string) ([]bool, error) {
	if err := p.open(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, errorf("amqpsem: probe channel: %w", err)
	}
	// A caller that gave up left confirms in flight: wait for them, so
	// that their returns are in the buffer and can be told apart.
	for i, dc := range p.pending {
		if err := p.await(ctx, dc, nil); err != nil {
			p.pending = p.pending[i:]
			return nil, err
		}
	}
	p.pending = nil
	p.drain(nil)

	first := p.seq + 1
	dcs := make([]*amqp.DeferredConfirmation, 0, len(queues))
	for _, q := range queues {
		p.seq++
		dc, err := p.ch.PublishWithDeferredConfirm("", q, true, false, amqp.Publishing{
			MessageId:  strconv.FormatUint(p.seq, 10),
			Expiration: "0",
		})
		if err != nil {
			p.pending = dcs
			return nil, errorf("amqpsem: probe %q: %w", q, p.c.connErr(err))
		}
		dcs = append(dcs, dc)
	}
	out := make([]bool, len(queues))
	for i := range out {
		out[i] = true
	}
	record := func(r amqp.Return) {
		id, err := strconv.ParseUint(r.MessageId, 10, 64)
		if err != nil || id < first || id >= first+uint64(len(queues)) {
			return // from a batch whose caller gave up
		}
		if r.ReplyCode == amqp.NoRoute {
			out[id-first] = false
		}
	}
	for i, dc := range dcs {
		if err := p.await(ctx, dc, record); err != nil {
			p.pending = dcs[i:]
			return nil, err
		}
	}
	if p.ch.IsClosed() {
		return nil, errorf("amqpsem: probe: %w", p.c.connErr(amqp.ErrClosed))
	}
	p.drain(record)
	return out, nil
}

// await waits for dc's confirm, passing the returns that arrive
// meanwhile to f (nil: dropped), so that the connection's reader, which
// hands each return over before the confirm that follows it, never waits
// on a full return buffer.
func (p *prober) await(ctx context.Context, dc *amqp.DeferredConfirmation, f func(amqp.Return)) error {
	returns := p.returns
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			if f != nil {
				f(r)
			}
		case <-dc.Done():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// drain takes every return already delivered. The connection's reader
// hands a return over before the confirm that follows it, so once a batch
// is confirmed its returns are all buffered.
func (p *prober) drain(f func(amqp.Return)) {
	for {
		select {
		case r, ok := <-p.returns:
			if !ok {
				return
			}
			if f != nil {
				f(r)
			}
		default:
			return
		}
	}
}

// probe is exists with a validity bound: it also returns when the probes
// were sent, for lease renewal.
func (p *prober) probe(ctx context.Context, queues ...string) ([]bool, time.Time, error) {
	sent := time.Now()
	got, err := p.exists(ctx, queues)
	if err != nil && !errors.Is(err, ctx.Err()) {
		err = errorf("amqpsem: %w", err)
	}
	return got, sent, err
}
