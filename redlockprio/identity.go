package redlockprio

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// identLife is how long a master keeps a Locker's identity key.
const identLife = time.Hour

func (l *Locker) identKey() string { return l.o.prefix + "ident:{" + l.nonce + "}" }

// verify makes sure, on first contact with m, that m is a server of its
// own: not one another master of the Locker reaches too (the same address
// twice, two names of one host). Each master writes its index to the
// Locker's identity key unless the key is there already, atomically; a
// master that finds another's index there is the same server as that
// one. Until m is verified its answers do not count; once two masters are
// found to be one server, the Locker refuses every acquisition with an
// error matching [locks.ErrInvalidOption].
func (l *Locker) verify(ctx context.Context, m *master) error {
	if m.verified.Load() || len(l.masters) == 1 {
		return nil
	}
	if err := l.dup.Load(); err != nil {
		return *err
	}
	v, err := runScript(ctx, identScript, m.c, []string{l.identKey()}, m.index, identLife.Milliseconds())
	if err != nil {
		return err
	}
	first, ok := v.(int64)
	if !ok {
		return fmt.Errorf("redlockprio: unexpected identity reply %v", v)
	}
	if int(first) != m.index {
		other := "?"
		if first >= 0 && int(first) < len(l.masters) {
			other = l.masters[first].addr
		}
		err := fmt.Errorf("redlockprio: master %d (%s) is the same server as master %d (%s): %w", m.index, m.addr, first, other,
			driver.InvalidOption("masters must be independent servers"))
		l.dup.CompareAndSwap(nil, &err)
		return *l.dup.Load()
	}
	m.verified.Store(true)
	return nil
}

// dupErr returns the error that two masters are one server, or nil.
func (l *Locker) dupErr() error {
	if err := l.dup.Load(); err != nil {
		return *err
	}
	return nil
}

// identify verifies every master once, on the Locker's first acquisition,
// so that two masters that are one server are refused before anything is
// granted: it waits until every master has answered, or until a quorum
// has been verified and the others have had as long again (10ms at
// least), or the call timeout, or ctx's end. A hung minority thus delays
// only the first acquisition, and little. Masters not verified then are
// verified by the first step they answer (see verify); until then their
// answers do not count.
func (l *Locker) identify(ctx context.Context) error {
	if len(l.masters) == 1 {
		return nil
	}
	l.identOnce.Do(func() {
		l.identDone = make(chan struct{})
		l.identQuorum = make(chan struct{})
		start := time.Now()
		var once sync.Once
		quorum := func() {
			once.Do(func() {
				l.identGrace = max(10*time.Millisecond, time.Since(start))
				close(l.identQuorum)
			})
		}
		if !l.goTracked(func() {
			defer close(l.identDone)
			calls, cancel := context.WithTimeout(context.Background(), l.callTO)
			defer cancel()
			l.fanout(calls, l.masters, func(ctx context.Context, m *master) (any, error) {
				return nil, l.verify(ctx, m)
			}, fan{enough: func(rs []result) bool {
				n := 0
				for _, r := range rs {
					if r.err == nil {
						n++
					}
				}
				if n >= l.quorum {
					quorum()
				}
				return l.dupErr() != nil
			}})
		}) {
			close(l.identDone)
		}
	})
	select {
	case <-l.identDone:
	case <-l.identQuorum:
		t := time.NewTimer(l.identGrace)
		select {
		case <-l.identDone:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	case <-ctx.Done():
		return ctx.Err()
	}
	return l.dupErr()
}
