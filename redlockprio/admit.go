package redlockprio

import "context"

// stepsPerName is how many of a Client's admitted steps about one name
// (see admit) may be under way at once. One, as many calls as the
// per-(master, name) ordering of all calls let run before: with 8 or 2,
// ten Clients of ten Locks each on N3, on a 2-core machine kept busy,
// had more calls in flight sharing the CPU, each slower, and some timed
// out (QuorumErrors the old ordering did not give there). A step waits
// for its turn on its Lock's context, not on its call timeout.
const stepsPerName = 1

// admission is the admitted steps about one name: a semaphore of
// stepsPerName slots, and how many steps hold or wait for one.
type admission struct {
	slots chan struct{}
	users int
}

// admit waits, until ctx ends, for one of the stepsPerName slots of the
// Client's steps about name that come from arrivals and waits (an
// acquire attempt, a ticket, a join's enqueue), and returns the function that
// frees it once the step has returned (its stragglers go on without it).
// A step's clock (its call timeout, an attempt's validity) starts once it
// is admitted: a burst of Locks of one name through one Client then
// waits its turn in the Client, on its contexts, rather than sending
// every call at once, or each behind all the others at each master,
// whose call timeouts would run out while they wait (a QuorumError with
// every master up). Releases, the deletions of failed attempts and leaves are not
// admitted: they hand the name over or clean up, and their number is
// bounded by the admitted steps'. Nor are refreshes, which keep the
// waiters' places: they go one step at a time per name, for every entry
// then due (see Client.refresh), so that they do not wait behind the
// arrivals and outlive the entries they refresh.
func (c *Client) admit(ctx context.Context, name string) (func(), error) {
	c.seqMu.Lock()
	a := c.admitted[name]
	if a == nil {
		a = &admission{slots: make(chan struct{}, stepsPerName)}
		c.admitted[name] = a
	}
	a.users++
	c.seqMu.Unlock()
	leave := func() {
		c.seqMu.Lock()
		if a.users--; a.users == 0 {
			delete(c.admitted, name)
		}
		c.seqMu.Unlock()
	}
	select {
	case a.slots <- struct{}{}:
		return func() {
			<-a.slots
			leave()
		}, nil
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	}
}
