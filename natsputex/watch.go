package natsputex

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// watch wakes a waiting call when one of its keys becomes free, and
// restarts the takeover clocks on every write it sees. Its KV watcher is
// made again each time the connection reconnects: the watcher's consumer
// may be gone with the server that ran it (a restart, a node lost), and
// nats.go would only notice after missing its heartbeats for 5–10 s.
type watch struct {
	wake chan struct{}

	quit   chan struct{} // closed by stop
	once   sync.Once
	cancel context.CancelFunc // ends every watcher's context, after the loop
	done   chan struct{}      // closed when the loop has returned
	// patience bounds stop's two waits together: max(T, 1s).
	patience time.Duration
}

// rewatchPause bounds the pause between attempts to make a watcher again
// after a reconnect, while the server cannot make one yet.
const rewatchPause = 500 * time.Millisecond

// watch starts the watch of a waiting call op on name's keys ks, whose
// takeover clocks are cl.
func (c *Client) watch(ctx context.Context, op, name string, ks []string, cl *clocks) (*watch, error) {
	pattern := ks[0]
	if len(ks) > 1 {
		pattern = name + ".*" // one filter: NATS 2.9 has no multi-filter consumers
	}
	// The watch is a consumer on the server, and nats.go ends it when the
	// context it was made with ends. So its context is its own, not ctx:
	// a ctx ending in the middle of the creation would leave a consumer
	// this call never learns of. stop ends it.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	// Listen for reconnects before the first watcher is made, so that none
	// is missed between the two.
	reconnected := c.st.nc.StatusChanged(nats.CONNECTED)
	kw, err := c.st.kv.Watch(wctx, pattern)
	if err != nil {
		c.st.nc.RemoveStatusListener(reconnected)
		cancel()
		return nil, driver.Errorf(backend, op, name, fmt.Errorf("watch: %w", err))
	}
	w := &watch{wake: make(chan struct{}, 1), quit: make(chan struct{}), cancel: cancel, done: make(chan struct{}),
		patience: max(c.o.ttl(), time.Second)}
	index := make(map[string]int, len(ks))
	for i, k := range ks {
		index[k] = i
	}
	wake := func() {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	// drain handles kw's entries until it closes its channel (after Stop
	// or when the connection closes): its callback blocks on a full
	// channel.
	drain := func(kw jetstream.KeyWatcher) {
		for e := range kw.Updates() {
			if e == nil {
				continue
			}
			i, ok := index[e.Key()]
			if !ok {
				continue
			}
			free := len(e.Value()) == 0 || string(e.Value()) == reservedValue
			if e.Operation() == jetstream.KeyValuePut && free {
				cl.seeBlank(i, e.Revision(), e.Created())
			} else {
				cl.see(i, e.Revision(), e.Created())
			}
			if e.Operation() != jetstream.KeyValuePut || free {
				wake()
			}
		}
	}
	go func() {
		defer close(w.done)
		var bg sync.WaitGroup
		defer bg.Wait()
		defer c.st.nc.RemoveStatusListener(reconnected)
		first := kw // the closure must not see kw replaced below
		bg.Go(func() { drain(first) })
		var retry <-chan time.Time
		for {
			select {
			case <-w.quit:
				_ = kw.Stop()
				return
			case _, ok := <-reconnected:
				if !ok {
					return
				}
			case <-retry:
			}
			retry = nil
			// The connection is back: a release may have gone unseen
			// while it was down, so the waiter looks again at once, and
			// a new watcher replaces the old one.
			wake()
			nkw, err := c.st.kv.Watch(wctx, pattern)
			if err != nil {
				retry = time.After(rewatchPause)
				continue
			}
			old := kw
			kw = nkw
			bg.Go(func() { drain(nkw) })
			bg.Go(func() { _ = old.Stop() })
		}
	}()
	return w, nil
}

// stopWatch stops w in the background, so that a waiting call returns as
// soon as it has its answer: stopping the watch deletes its consumer, a
// request that waits out its timeout (5s) when the node running the
// consumer, or the meta leader, is unreachable. Close waits for it; a
// closed client stops it here.
func (c *Client) stopWatch(w *watch) {
	if !c.reg.Go(w.stop) {
		w.stop()
	}
}

// stop ends the watch and waits, up to max(T, 1s) in all, for its
// goroutines to end: a watcher on a connection that is gone may never
// answer the request that deletes its consumer (found by an attack: a
// Supervisor's Run took 5.3 s to return after its link was cut).
func (w *watch) stop() {
	w.once.Do(func() { close(w.quit) })
	select {
	case <-w.done:
	case <-time.After(w.patience / 2):
	}
	w.cancel()
	select {
	case <-w.done:
	case <-time.After(w.patience / 2):
	}
}
