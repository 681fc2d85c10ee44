package redlockprio

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// Theft, the thief's side: the holders an attempt displaced are told, and
// neither the thief nor anyone else uses the name until each has
// acknowledged or run out of validity. (The victim's side is notice.)

// victim is a holder an attempt displaced, with how long it may still
// believe it holds.
type victim struct {
	inbox string
	until time.Time
	// proxy: one of its keys had been taken from an earlier holder. Such
	// a key may stand for that holder (a failed attempt keeps it for a
	// holder it displaced and could not tell), so an acknowledgement
	// from a victim that no longer knows the key (see notice) does not
	// count: the key is waited out.
	proxy bool
}

// victimsOf returns the holders that gs displaced, by holder id: each may
// run until the largest PTTL its keys had when displaced, plus the drift
// allowance over that time (at least the Client's own), counted from when
// the answer arrived. A displaced key's PTTL covers the validity of every
// holder displaced before it too, whatever their TTLs: a thief's key
// never expires before the key it displaced would have, and renewals
// never shorten a key (see acquireScript).
func (c *Client) victimsOf(gs []grant) map[string]*victim {
	var victims map[string]*victim // nil when nobody was displaced
	for _, g := range gs {
		if g.status != 2 || g.holder == "" {
			continue
		}
		until := g.at.Add(g.pttl + max(c.drift, c.o.driftOver(g.pttl)))
		if v := victims[g.holder]; v == nil {
			if victims == nil {
				victims = map[string]*victim{}
			}
			victims[g.holder] = &victim{inbox: g.vinbox, until: until}
		} else if until.After(v.until) {
			v.until = until
		}
		if g.vfrom != "" {
			victims[g.holder].proxy = true
		}
	}
	return victims
}

// ackWait is the acknowledgement a Client waits for from one victim: ch
// is closed when it comes. proxy: a key of the victim's may stand for an
// earlier holder (see victim), so only an acknowledgement from a victim
// that knows the key ("A") closes ch, not one from a victim that does
// not ("U", see notice).
type ackWait struct {
	ch    chan struct{}
	proxy bool
}

// tell sends each victim a theft notice and returns, by victim id, the
// channels its acknowledgement closes; hand them to waitVictims or
// forgetAcks.
func (c *Client) tell(victims map[string]*victim) map[string]chan struct{} {
	acks := map[string]chan struct{}{}
	c.mu.Lock()
	for id, v := range victims {
		w := c.acks[id]
		if w == nil {
			w = &ackWait{ch: make(chan struct{})}
			c.acks[id] = w
		}
		w.proxy = w.proxy || v.proxy
		acks[id] = w.ch
	}
	c.mu.Unlock()
	desc := strings.ReplaceAll(fmt.Sprintf("%s with priority %d", c.id, c.o.priority), "|", "/")
	for id, v := range victims {
		c.publish(v.inbox, "N|"+id+"|"+c.inbox+"|"+desc)
	}
	return acks
}

// waitVictims waits until each victim has acknowledged or its validity has
// run out, or until cutoff if it is not zero, and returns true, reporting
// an [driver.EventAckWait] for the name; when the Client closes first it
// returns false at once: the victims may then still run.
func (c *Client) waitVictims(name string, token uint64, victims map[string]*victim, acks map[string]chan struct{}, cutoff time.Time) bool {
	defer c.forgetAcks(acks)
	start := time.Now()
	defer func() {
		c.reg.Emit(driver.Event{Kind: driver.EventAckWait, Name: name, Token: token, Duration: time.Since(start)})
	}()
	for id, v := range victims {
		until := v.until
		if !cutoff.IsZero() && cutoff.Before(until) {
			until = cutoff
		}
		t := time.NewTimer(time.Until(until))
		select {
		case <-acks[id]:
		case <-t.C:
		case <-c.done:
			t.Stop()
			return false
		}
		t.Stop()
	}
	return true
}

func (c *Client) forgetAcks(acks map[string]chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, ch := range acks {
		if w := c.acks[id]; w != nil && w.ch == ch {
			delete(c.acks, id)
		}
	}
}

// awaitVictims waits, for a thief's lease e, until each victim has
// acknowledged the notice it is sent or its validity has run out,
// whichever comes first; then it deletes the other slots' keys taken from
// victims (extraTaken). The wait goes on in the background when ctx ends
// first: the lease is then released once it is over, and the call returns
// ctx's error. A thief robbed meanwhile returns a [locks.HeldError] once
// its own victims have let go (the chain of thieves).
func (a *attempt) awaitVictims(ctx context.Context, e *Lease, victims map[string]*victim, extraTaken []grant) (locks.Lease, error) {
	c, cl, lease := a.c, a.cl, e.l
	c.reg.Emit(driver.Event{Kind: driver.EventTheft, Name: cl.name, Token: lease.Token()})
	cutoff := time.Time{}
	if c.o.unsafeSteal >= 0 {
		cutoff = a.start.Add(time.Duration(c.o.unsafeSteal * float64(c.o.ttl)))
	}
	acks := c.tell(victims)
	started := c.goTracked(func() {
		over := c.waitVictims(cl.name, lease.Token(), victims, acks, cutoff)
		c.mu.Lock()
		cl.waitOver = true
		cl.victimsLive = !over // the Client closed: leave the keys to expire
		givenUp := cl.givenUp
		cl.markAckable()
		c.mu.Unlock()
		if over {
			c.deleteKeys(context.Background(), cl, leftoversOf(extraTaken))
		}
		if givenUp {
			_ = lease.Release(context.Background())
		}
	})
	if !started {
		c.forgetAcks(acks)
		cl.markAckable()
		_ = lease.Release(context.Background()) // keeps the keys (victimsLive)
		return nil, locks.ErrClosed
	}
	select {
	case <-cl.ackable:
	case <-ctx.Done():
		c.mu.Lock()
		over := cl.waitOver
		cl.givenUp = !over
		c.mu.Unlock()
		if over {
			_ = lease.Release(context.WithoutCancel(ctx))
		}
		return nil, fmt.Errorf("waiting for the displaced holder: %w", ctx.Err())
	}
	if !lease.Live() {
		cause := context.Cause(lease.Context())
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, &locks.HeldError{Name: cl.name, Err: cause}
	}
	return e, nil
}
