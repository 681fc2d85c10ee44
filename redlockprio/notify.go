package redlockprio

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/locks"
)

// Notifications travel over Redis pub/sub, on every master, through one
// PubSub connection per master per Locker, multiplexed:
//   - the Locker's inbox channel carries theft notices
//     "N|victim id|reply channel|thief" and acknowledgements "A|victim id";
//   - each name's release channel, subscribed while someone waits on the
//     name, carries the release scripts' PUBLISH.

// subscribeInbox subscribes the Locker's inbox on every master, once, and
// waits until every master confirmed (or a short time passed, so that a
// dead minority does not stall acquisitions).
func (l *Locker) subscribeInbox(ctx context.Context) error {
	l.subOnce.Do(func() {
		l.subMu.Lock()
		defer l.subMu.Unlock()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		for i, m := range l.masters {
			ps := m.c.Subscribe(sctx, l.inbox) // an error is retried by the PubSub
			ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(1024))
			if !l.goTracked(func() { l.dispatch(i, ch) }) {
				_ = ps.Close()
				continue
			}
			l.pubsubs = append(l.pubsubs, ps)
		}
		limit := min(time.Second, l.o.ttl/4)
		l.goTracked(func() {
			t := time.NewTimer(limit)
			defer t.Stop()
			select {
			case <-t.C:
			case <-l.done:
			case <-l.subAllAcked():
			}
			l.subReadyOnce()
		})
	})
	select {
	case <-l.subReady:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// subAllAcked returns a channel closed once every master confirmed the
// inbox subscription.
func (l *Locker) subAllAcked() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.subAll == nil {
		l.subAll = make(chan struct{})
	}
	return l.subAll
}

func (l *Locker) subReadyOnce() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.subReady:
	default:
		close(l.subReady)
	}
}

// dispatch handles what master i's PubSub delivers until it is closed.
func (l *Locker) dispatch(i int, ch <-chan any) {
	for msg := range ch {
		switch msg := msg.(type) {
		case *redis.Subscription:
			if msg.Kind == "subscribe" && msg.Channel == l.inbox {
				l.mu.Lock()
				l.subAcked[i] = true
				all := true
				for _, ok := range l.subAcked {
					all = all && ok
				}
				if all && l.subAll == nil {
					l.subAll = make(chan struct{})
				}
				if all {
					select {
					case <-l.subAll:
					default:
						close(l.subAll)
					}
				}
				l.mu.Unlock()
			}
		case *redis.Message:
			if msg.Channel == l.inbox {
				l.inboxMessage(msg.Payload)
				continue
			}
			l.mu.Lock()
			for w := range l.watchers[msg.Channel] {
				select {
				case w <- struct{}{}:
				default:
				}
			}
			l.mu.Unlock()
		}
	}
}

func (l *Locker) inboxMessage(payload string) {
	parts := strings.SplitN(payload, "|", 4)
	switch {
	case len(parts) == 2 && parts[0] == "A":
		l.mu.Lock()
		if ch := l.acks[parts[1]]; ch != nil {
			close(ch)
			delete(l.acks, parts[1])
		}
		l.mu.Unlock()
	case len(parts) == 4 && parts[0] == "N":
		l.notice(parts[1], parts[2], parts[3])
	}
}

// notice handles a thief's notice: the lease (or attempt) with holder id
// vid ends with ErrPreempted at once, and the thief gets its
// acknowledgement once the lease can no longer be in use — at once,
// unless the lease is itself a thief still waiting for its own victim
// (the chain of thieves), in which case the acknowledgement waits for
// that.
func (l *Locker) notice(vid, reply, thief string) {
	l.mu.Lock()
	e := l.entries[vid]
	var (
		base    *locks.BaseLease
		settled chan struct{}
		cause   error
	)
	if e != nil {
		cause = locks.Preempted(fmt.Errorf("redlockprio: %q taken by %s", e.name, thief))
		if e.robbed == nil {
			e.robbed = cause
		}
		base, settled = e.base, e.settled
	}
	l.mu.Unlock()
	if base != nil {
		base.End(cause)
	}
	l.goTracked(func() {
		if settled != nil {
			select {
			case <-settled:
			case <-l.done:
				return
			}
		}
		l.publish(reply, "A|"+vid)
	})
}

// publish sends payload on channel through every master, in the
// background.
func (l *Locker) publish(channel, payload string) {
	for _, m := range l.masters {
		l.goTracked(func() {
			ctx, cancel := context.WithTimeout(context.Background(), max(l.o.ttl/2, time.Second))
			defer cancel()
			_ = m.c.Publish(ctx, channel, payload).Err()
		})
	}
}

// watch subscribes to a release channel for one waiter and returns its
// wake-up channel and the function that ends the watch.
func (l *Locker) watch(ctx context.Context, channel string) (<-chan struct{}, func()) {
	w := make(chan struct{}, 1)
	l.subMu.Lock()
	defer l.subMu.Unlock()
	l.mu.Lock()
	ws := l.watchers[channel]
	first := ws == nil
	if first {
		ws = map[chan struct{}]struct{}{}
		l.watchers[channel] = ws
	}
	ws[w] = struct{}{}
	l.mu.Unlock()
	if first {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		for _, ps := range l.pubsubs {
			_ = ps.Subscribe(sctx, channel) // retried by the PubSub on reconnect
		}
		cancel()
	}
	return w, func() {
		l.subMu.Lock()
		defer l.subMu.Unlock()
		l.mu.Lock()
		delete(ws, w)
		last := len(ws) == 0
		if last {
			delete(l.watchers, channel)
		}
		l.mu.Unlock()
		if last {
			sctx, cancel := context.WithTimeout(context.Background(), time.Second)
			for _, ps := range l.pubsubs {
				_ = ps.Unsubscribe(sctx, channel)
			}
			cancel()
		}
	}
}
