package redlockprio

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// Reading the masters' answers to a step: the acquire script's grants,
// whether they decide the outcome, and why an attempt that did not win
// failed.

// grant is one master's answer to the acquire script.
type grant struct {
	m       *master
	status  int64 // 0 held, 1 free slot taken, 2 slot taken from a lower priority
	slot    int
	counter uint64
	holder  string // held: a holder's id; theft: the victim's id
	vprio   int64
	pttl    time.Duration
	vinbox  string
	vfrom   string    // theft: whom the victim's key was taken from, if anyone
	at      time.Time // when the answer arrived
}

// parseGrant decodes a master's answer to the acquire script on a name
// of size slots. Whatever the answer, it gives a grant or an error, never
// a panic: a status or slot out of range is an error, and a displaced
// holder whose remaining time the master could not tell (a key without an
// expiry, which only a stranger's write makes) is assumed to have a whole
// ttl left, so that a theft waits for it rather than not at all.
func parseGrant(r answer, size int, ttl time.Duration) (grant, error) {
	g := grant{m: r.m}
	vals, ok := r.val.([]any)
	if !ok || len(vals) < 3 {
		return g, fmt.Errorf("unexpected acquire reply %v", r.val)
	}
	num := func(i int) int64 {
		if i < len(vals) {
			n, _ := vals[i].(int64)
			return n
		}
		return 0
	}
	str := func(i int) string {
		if i < len(vals) {
			s, _ := vals[i].(string)
			return s
		}
		return ""
	}
	g.status, g.counter = num(0), uint64(max(num(2), 0))
	switch g.status {
	case 0:
		g.holder, g.pttl = str(3), millis(max(num(4), 0))
	case 1, 2:
		slot := num(1)
		if slot < 1 || slot > int64(size) {
			return grant{m: r.m}, fmt.Errorf("acquire reply names slot %d of %d", slot, size)
		}
		g.slot = int(slot)
		if g.status == 2 {
			g.holder, g.vprio, g.vinbox, g.vfrom = str(3), num(4), str(6), str(7)
			g.pttl = millis(num(5))
			if num(5) < 0 {
				g.pttl = ttl
			}
		}
	default:
		return grant{m: r.m}, fmt.Errorf("acquire reply with status %d", g.status)
	}
	return g, nil
}

// millis converts a master's milliseconds to a Duration, capped (at about
// 35 years) so that no answer overflows into a negative wait.
func millis(ms int64) time.Duration {
	return time.Duration(min(ms, 1<<40)) * time.Millisecond
}

// slotGrants are the grants of one slot.
type slotGrants struct {
	slot int
	gs   []grant
}

// grantDecided says whether the acquire answers so far decide the
// outcome of an attempt at a lock (one slot), and so which outcome it
// is: a quorum granted (won); so many masters failed that fewer than a
// quorum can answer (a QuorumError); or a quorum answered and so few
// granted that the masters yet to answer cannot make a quorum (held).
// Failures and "held" answers are not added up: with a dead minority, a
// held name must read as held, not as a quorum failure, so the live
// masters' answers are awaited (up to the call timeout).
func (c *Client) grantDecided(rs []answer) bool {
	granted, answered, failed := 0, 0, 0
	for _, r := range rs {
		if r.err != nil {
			failed++
			continue
		}
		answered++
		if v, ok := r.val.([]any); ok && len(v) > 0 && v[0] != int64(0) {
			granted++
		}
	}
	pending := len(c.masters) - len(rs)
	switch {
	case granted >= c.quorum:
		return true
	case failed > len(c.masters)-c.quorum:
		return true
	case answered >= c.quorum && granted+pending < c.quorum:
		return true
	}
	return false
}

// noteLongest records the PTTL of another holder's key seen in an answer.
func (c *Client) noteLongest(d time.Duration) {
	ms := d.Milliseconds()
	for {
		cur := c.longest.Load()
		if ms <= cur || c.longest.CompareAndSwap(cur, ms) {
			return
		}
	}
}

// keptFor is how long a key that a failed attempt may have taken, on a
// master whose answer it did not get, can live: the key was set to the
// longer of the attempt's TTL and the displaced key's PTTL, which the
// attempt did not see; the longest PTTL this Client has seen on another
// holder's key stands in for it.
func (c *Client) keptFor() time.Duration {
	d := max(c.o.ttl, time.Duration(c.longest.Load())*time.Millisecond)
	return d + c.o.driftOver(d)
}

func heldError(name string, held []grant, quorum, size int, err error) error {
	he := &locks.HeldError{Name: name, Err: err}
	// A lock held by different holders on different masters, none on a
	// quorum of the answers, is a split vote between attempts (waiters
	// that all retried as the last holder's keys expired): their keys go
	// at once, so waiting out their PTTLs (a whole TTL) would leave the
	// name free for nothing. Retry soon, at a random moment. (One holder
	// seen on fewer masters, the others down, is waited out as before.)
	owners := map[string]int{}
	for _, g := range held {
		owners[g.holder]++
	}
	split := size == 1 && len(owners) > 1
	for _, g := range held {
		if split && owners[g.holder] < quorum {
			continue
		}
		if g.pttl > 0 && (he.RetryAfter == 0 || g.pttl < he.RetryAfter) {
			he.RetryAfter = g.pttl
			he.Holder = g.holder
		}
	}
	if he.RetryAfter == 0 {
		he.RetryAfter = splitRetry + rand.N(splitRetry*3) // split votes: retry soon
	}
	return he
}

// splitRetry is the least wait before retrying after a split vote.
const splitRetry = 5 * time.Millisecond

// quorumAnswered says whether a quorum of masters answered without error.
func (c *Client) quorumAnswered(rs []answer) bool {
	n := 0
	for _, r := range rs {
		if r.err == nil {
			n++
		}
	}
	return n >= c.quorum
}

// tally counts the masters that answered without error, and returns the
// errors of the others.
func tally(rs []answer) (answered int, errs []error) {
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, r.err)
		} else {
			answered++
		}
	}
	return answered, errs
}
