package redlockprio

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// identLife is how long a master keeps a Client's identity key.
const identLife = time.Hour

func (c *Client) identKey() string { return c.o.prefix + "ident:{" + c.nonce + "}" }

// verify makes sure, on first contact with m, that m is a server of its
// own: not one another master of the Client reaches too (the same address
// twice, two names of one host). Each master writes its index to the
// Client's identity key unless the key is there already, atomically; a
// master that finds another's index there is the same server as that
// one. Until m is verified its answers do not count; once two masters are
// found to be one server, the Client refuses every acquisition with an
// error matching [locks.ErrInvalidOption].
func (c *Client) verify(ctx context.Context, m *master) error {
	if m.verified.Load() || len(c.masters) == 1 {
		return nil
	}
	if err := c.dup.Load(); err != nil {
		return *err
	}
	v, err := runScript(ctx, identScript, m.c, []string{c.identKey()}, m.index, identLife.Milliseconds())
	if err != nil {
		return err
	}
	first, ok := v.(int64)
	if !ok {
		return fmt.Errorf("unexpected identity reply %v", v)
	}
	if int(first) != m.index {
		other := "?"
		if first >= 0 && int(first) < len(c.masters) {
			other = c.masters[first].addr
		}
		err := fmt.Errorf("master %d (%s) is the same server as master %d (%s): %w", m.index, m.addr, first, other,
			driver.InvalidOption("masters must be independent servers"))
		c.dup.CompareAndSwap(nil, &err)
		return *c.dup.Load()
	}
	m.verified.Store(true)
	return nil
}

// dupErr returns the error that two masters are one server, or nil.
func (c *Client) dupErr() error {
	if err := c.dup.Load(); err != nil {
		return *err
	}
	return nil
}

// identify verifies every master once, on the Client's first acquisition,
// so that two masters that are one server are refused before anything is
// granted: it waits until every master has answered, or until a quorum
// has been verified and the others have had as long again (10ms at
// least), or the call timeout, or ctx's end. A hung minority thus delays
// only the first acquisition, and little. Masters not verified then are
// verified by the first step they answer (see verify); until then their
// answers do not count.
func (c *Client) identify(ctx context.Context) error {
	if len(c.masters) == 1 {
		return nil
	}
	c.identOnce.Do(func() {
		c.identDone = make(chan struct{})
		c.identQuorum = make(chan struct{})
		start := time.Now()
		var once sync.Once
		quorum := func() {
			once.Do(func() {
				c.identGrace = max(10*time.Millisecond, time.Since(start))
				close(c.identQuorum)
			})
		}
		if !c.goTracked(func() {
			defer close(c.identDone)
			calls, cancel := context.WithTimeout(context.Background(), c.callTO)
			defer cancel()
			c.callMasters(calls, c.masters, func(ctx context.Context, m *master) (any, error) {
				return nil, c.verify(ctx, m)
			}, callPolicy{decides: func(rs []answer) bool {
				n := 0
				for _, r := range rs {
					if r.err == nil {
						n++
					}
				}
				if n >= c.quorum {
					quorum()
				}
				return c.dupErr() != nil
			}})
		}) {
			close(c.identDone)
		}
	})
	select {
	case <-c.identDone:
	case <-c.identQuorum:
		t := time.NewTimer(c.identGrace)
		select {
		case <-c.identDone:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	case <-ctx.Done():
		return ctx.Err()
	}
	return c.dupErr()
}
