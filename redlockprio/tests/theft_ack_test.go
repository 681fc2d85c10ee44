package redlockprio_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// The theft acknowledgement over kept keys: a failed attempt that did not
// hear every master answers "U", a holder that let go answers "A", and a
// thief whose displaced key had a 'from' field ignores "U" and waits the
// key out (see docs/protocols/redlockprio.md, "Displaced but unused
// keys").

// ackBound is the bound on a thief's wait for a victim that has let go:
// the notice and its answer, a few round trips, plus slack measured on
// the spot.
func ackBound(t *testing.T, addr string) contracttest.Bound {
	rc := newRedis(addr)
	t.Cleanup(func() { _ = rc.Close() })
	return contracttest.MeasureBound(t, 100*time.Millisecond, func() error { return rc.Ping(context.Background()).Err() })
}

// TestUnheardMasterLeavesAttemptUnsure: V (TTL 3s, priority 1) holds a name
// on three masters, its link to master 0 cut right after the grant, so
// master 0's key is never renewed while masters 1 and 2 renew V's lease
// (validity ~t0+4.95s). Then V is cut off altogether. H (priority 2, TTL
// 600ms, call timeout 100ms) tries, hearing master 0 only (V's stale key,
// PTTL ~0.9s) and failing: H waits for V (who cannot hear) only that PTTL,
// and keeps its keys on masters 1 and 2 (from=V, PTTL ≥ V's). C (priority
// 3) steals H's keys:
//   - "C while H waits": C's notice finds H's claim still there, which
//     answers "A" once H's wait for V is over, whatever the 'from' field:
//     C may be granted at ~t0+3.03 while V is valid until ~t0+4.95;
//   - "C after H forgot": the notice comes after H's claim is gone: "U",
//     which C ignores, and it waits the keys out.
func TestUnheardMasterLeavesAttemptUnsure(t *testing.T) {
	for _, early := range []bool{true, false} {
		t.Run(map[bool]string{true: "C while H waits", false: "C after H forgot"}[early], func(t *testing.T) {
			staleHeardMaster(t, early, true)
		})
	}
	// The control: master 0 renewed like the others (V's link to it not
	// cut), so the PTTL H hears there covers V's validity.
	t.Run("fresh master 0/C while H waits", func(t *testing.T) { staleHeardMaster(t, true, false) })
}

func staleHeardMaster(t *testing.T, early, stale bool) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	const vTTL = 3 * time.Second
	v := mustClient(t, addrs, viaProxies(), withTiming(vTTL, 0.01), withPriority(1))
	h := mustClient(t, addrs, viaProxies(), withTiming(600*time.Millisecond, 0.01), withPriority(2), with(redlockprio.WithCallTimeout(100*time.Millisecond)))
	c := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(3))
	warm(t, v.l)
	warm(t, h.l)
	warm(t, c.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 30*time.Second)
	vl, err := v.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if stale {
		v.proxies[0].Cut() // master 0 keeps V's key of the grant, never renewed
	}
	t0 := hist.Now()
	sv := hist.Begin("V", vl)
	done := sv.Hold(false)
	// Wait for V's second renewal (on masters 1 and 2 only).
	dl := vl.(*redlockprio.Lease)
	for time.Until(dl.Deadline()) < vTTL-200*time.Millisecond || hist.Now()-t0 < 1900*time.Millisecond {
		if hist.Now()-t0 > 2600*time.Millisecond {
			t.Skip("V's second renewal did not come in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
	v.cut()
	vDeadline := time.Until(dl.Deadline()) + hist.Now()
	for i, a := range addrs {
		t.Logf("at %v master %d holder %q PTTL %v", ms(hist.Now()), i, holderOf(t, a, name), maxPTTL(t, []string{a}, name))
	}
	t.Logf("V granted %v, its deadline now %v", ms(t0), ms(vDeadline))
	testenv.Proxies(h.proxies[1:]).DelayReplies(400 * time.Millisecond)
	_, herr := h.l.Lock(ctx, name)
	var qe *redlockprio.QuorumError
	t.Logf("H's Lock at %v: %v (QuorumError %v)", ms(hist.Now()), herr, errors.As(herr, &qe))
	if herr == nil {
		t.Skip("H was granted")
	}
	if !early {
		// H's claim waits for V until master 0's PTTL (≤ 1.1s) has run
		// out; come after that, and after H's own kept bound.
		time.Sleep(1300 * time.Millisecond)
	} else {
		time.Sleep(100 * time.Millisecond) // the keys H kept are in
	}
	for i, a := range addrs {
		t.Logf("at %v master %d holder %q PTTL %v", ms(hist.Now()), i, holderOf(t, a, name), maxPTTL(t, []string{a}, name))
	}
	cBegun := hist.Now()
	cl, err := c.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sc := hist.Begin("C", cl)
	sc.Write(hist.Now())
	sc.LetGo()
	_ = cl.Release(ctx)
	<-done
	xv := sv.Record()
	t.Logf("V context ended %v (%v), last write %v, deadline %v; C began %v, granted %v (waited %v)",
		ms(xv.ContextEnd), context.Cause(vl.Context()), ms(xv.LastWrite), ms(vDeadline), ms(cBegun), ms(sc.Record().Granted), ms(sc.Record().Granted-cBegun))
	if g := sc.Record().Granted; g < vDeadline {
		t.Errorf("C granted at %v, %v before V's validity deadline %v (V never acknowledged)", ms(g), ms(vDeadline-g), ms(vDeadline))
	}
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}

// TestReleasedThiefVouchesForItsKeys: a healthy chain. V (priority 0,
// TTL 600ms) holds and lets go at once when preempted; T (priority 1, TTL
// 3s) steals and is granted (its keys have from=V). T writes, then its
// link to master 0 is cut and it releases: the release reaches masters 1
// and 2 only, and T's key stays on master 0 (PTTL up to 3s). U (priority
// 2, TTL 600ms) then Locks: masters 1 and 2 are free, master 0 has T's
// key, so U tells T. T let go long ago; its claim is gone, so it answers
// "U", which U ignores since T's key had a 'from'. The docs: a thief's
// Lock returns when the victim has acknowledged or its validity has run
// out; a holder that let go (Release) is the case the acknowledgement is
// for. U's wait is checked against the bound.
func TestReleasedThiefVouchesForItsKeys(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	v := mustClient(t, addrs, withPriority(0))
	th := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
	u := mustClient(t, addrs, withPriority(2))
	warm(t, v.l)
	warm(t, th.l)
	warm(t, u.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	vl, err := v.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sv := hist.Begin("V", vl)
	vdone := sv.Hold(true)
	begun := time.Now()
	tl, err := th.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	st := hist.Begin("T", tl)
	t.Logf("T granted after %v", time.Since(begun))
	<-vdone
	st.Write(hist.Now())
	time.Sleep(300 * time.Millisecond) // a renewal or so
	st.Write(hist.Now())
	st.LetGo()
	th.proxies[0].Cut()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	rerr := tl.Release(rctx)
	cancel()
	t.Logf("T released at %v: %v", ms(hist.Now()), rerr)
	for i, a := range addrs {
		t.Logf("at %v master %d holder %q PTTL %v", ms(hist.Now()), i, holderOf(t, a, name), maxPTTL(t, []string{a}, name))
	}
	time.Sleep(50 * time.Millisecond)
	bound := ackBound(t, addrs[1])
	stopWatch := bound.Watch()
	begun = time.Now()
	ul, err := u.l.Lock(ctx, name)
	stopWatch()
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(begun)
	su := hist.Begin("U", ul)
	su.Write(hist.Now())
	su.LetGo()
	_ = ul.Release(ctx)
	t.Logf("U waited %v for T (U began 50ms after T released)", waited)
	bound.Check(t, "U's wait for T, which had let go (Release) before U began,", waited)
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}

// TestChainOverKeptKeys: V (TTL 3s, priority 1) holds and is cut
// off; H (TTL 300ms, priority 2, call timeout 100ms) tries hearing no
// master in time and fails, keeping V's keys (from=V). 500ms later C
// (priority 3, TTL 600ms) steals H's kept keys and waits them out; 300ms
// after C began, D (priority 4, TTL 600ms) steals C's keys:
//   - "D while C waits": C's Lock is still waiting;
//   - "C gave up": C's Lock context ended (200ms) before D came;
//   - "C closed": C's Client closed while waiting, before D came.
//
// Neither C nor D may be granted before V's validity deadline; each
// grant is logged against it (liveness: how long after it).
func TestChainOverKeptKeys(t *testing.T) {
	for _, variant := range []string{"D while C waits", "C gave up", "C closed"} {
		t.Run(variant, func(t *testing.T) { chainOverKeptKeys(t, variant) })
	}
}

func chainOverKeptKeys(t *testing.T, variant string) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	const hTTL = 300 * time.Millisecond
	v := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
	h := mustClient(t, addrs, viaProxies(), withTiming(hTTL, 0.01), withPriority(2), with(redlockprio.WithCallTimeout(100*time.Millisecond)))
	c := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(3))
	d := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(4))
	warm(t, v.l)
	warm(t, h.l)
	warm(t, c.l)
	warm(t, d.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	vl, err := v.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sv := hist.Begin("V", vl)
	done := sv.Hold(false)
	v.cut()
	vDeadline := time.Until(vl.(*redlockprio.Lease).Deadline()) + hist.Now()
	h.proxies.DelayReplies(400 * time.Millisecond)
	begun := time.Now()
	_, herr := h.l.Lock(ctx, name)
	t.Logf("H's Lock at %v: %v", ms(hist.Now()), herr)
	if herr == nil {
		t.Skip("H was granted")
	}
	time.Sleep(time.Until(begun.Add(500 * time.Millisecond)))
	for i, a := range addrs {
		t.Logf("at %v master %d holder %q PTTL %v", ms(hist.Now()), i, holderOf(t, a, name), maxPTTL(t, []string{a}, name))
	}
	type result struct {
		at  time.Duration
		err error
	}
	cctx := ctx
	if variant == "C gave up" {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
	}
	cres := make(chan result, 1)
	cBegun := hist.Now()
	go func() {
		cl, err := c.l.Lock(cctx, name)
		if err != nil {
			cres <- result{hist.Now(), err}
			return
		}
		sc := hist.Begin("C", cl)
		sc.Write(hist.Now())
		sc.LetGo()
		cres <- result{sc.Record().Granted, nil}
		<-cl.Context().Done() // D preempts it, or it is left to expire
		_ = cl.Release(context.Background())
	}()
	time.Sleep(300 * time.Millisecond)
	if variant == "C closed" {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		t.Logf("C closed at %v: %v", ms(hist.Now()), c.Close(cctx))
		cancel()
	}
	for i, a := range addrs {
		t.Logf("at %v master %d holder %q PTTL %v", ms(hist.Now()), i, holderOf(t, a, name), maxPTTL(t, []string{a}, name))
	}
	dBegun := hist.Now()
	dl, err := d.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sd := hist.Begin("D", dl)
	sd.Write(hist.Now())
	sd.LetGo()
	_ = dl.Release(ctx)
	r := <-cres
	<-done
	dg := sd.Record().Granted
	t.Logf("V deadline %v, last write %v; C began %v, Lock returned %v (%v); D began %v, granted %v (%v after V's deadline)",
		ms(vDeadline), ms(sv.Record().LastWrite), ms(cBegun), ms(r.at), r.err, ms(dBegun), ms(dg), ms(dg-vDeadline))
	t.Logf("sections:\n%v", hist)
	if r.err == nil && r.at < vDeadline {
		t.Errorf("C granted at %v, before V's deadline %v", ms(r.at), ms(vDeadline))
	}
	if dg < vDeadline {
		t.Errorf("D granted at %v, before V's deadline %v", ms(dg), ms(vDeadline))
	}
	if dg > vDeadline+time.Second {
		t.Errorf("D granted at %v, %v after V's deadline %v", ms(dg), ms(dg-vDeadline), ms(vDeadline))
	}
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}

// TestReleaseRacingHigherThiefIsAcknowledged: no faults. Each round, V (priority
// 0, TTL 600ms) holds a fresh name and lets go when preempted; T
// (priority 1, TTL 3s) steals it and is granted (its keys have from=V).
// Then T's Release and U's Lock (priority 2, TTL 600ms) start together.
// Where U's acquire lands on a master before T's release there and U's
// notice reaches T after its Release began (which drops the claim at
// once), T answers "U", which U ignores: U then waits T's key out (up to
// 3s) although T let go. Each round's wait is logged; waits over the
// bound (a few round trips, measured) are counted and reported.
func TestReleaseRacingHigherThiefIsAcknowledged(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	v := mustClient(t, addrs, withPriority(0))
	th := mustClient(t, addrs, withTiming(3*time.Second, 0.01), withPriority(1))
	u := mustClient(t, addrs, withPriority(2))
	warm(t, v.l)
	warm(t, th.l)
	warm(t, u.l)
	ctx := ctxFor(t, 60*time.Second)
	const rounds = 15
	long := 0
	bound := ackBound(t, addrs[0])
	for i := 0; i < rounds; i++ {
		name := uniqueName(t)
		hist := contracttest.NewWriteHistory() // one name a round
		vl, err := v.l.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		sv := hist.Begin("V", vl)
		vdone := sv.Hold(true)
		tl, err := th.l.Lock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		<-vdone
		st := hist.Begin("T", tl)
		st.Write(hist.Now())
		time.Sleep(20 * time.Millisecond)
		start := make(chan struct{})
		rdone := make(chan struct{})
		go func() {
			defer close(rdone)
			<-start
			time.Sleep(time.Duration(i%5) * 200 * time.Microsecond)
			st.LetGo()
			_ = tl.Release(context.Background())
		}()
		stopWatch := bound.Watch()
		begun := time.Now()
		close(start)
		ul, err := u.l.Lock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		waited := time.Since(begun)
		stopWatch()
		su := hist.Begin("U", ul)
		su.Write(hist.Now())
		su.LetGo()
		<-rdone
		_ = ul.Release(ctx)
		t.Logf("round %d: U waited %v", i, waited)
		if waited > bound.Limit() {
			long++
		}
		if err := hist.Check(); err != nil {
			t.Logf("round %d sections:\n%v", i, hist)
			t.Error(err)
		}
	}
	if long > 0 {
		t.Errorf("%d of %d rounds: U waited over %v for T, which had let go (Release)", long, rounds, bound)
	}
}

// TestSemaphoreKeptSlotsOutlastVictims: a Semaphore of size 2. V1 and V2 (TTL 3s,
// priority 0) hold its two slots and are cut off. H (priority 1, TTL
// 300ms, call timeout 100ms) acquires hearing no master in time and
// fails: it keeps the key it took on each master (from=V1 or V2, in
// either slot). 600ms after H began, C1 (priority 2) acquires: it takes
// the V keys (priority 0) and waits; 300ms later C2 (priority 2) takes
// H's kept keys (priority 1), whose 'from' makes it ignore H's "U".
// Neither may be granted before V1's and V2's validity (both end within
// a few ms of each other); writes are recorded per slot.
func TestSemaphoreKeptSlotsOutlastVictims(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	mk := func(opts ...clientOption) (*client, *redlockprio.Semaphore) {
		c := mustClient(t, addrs, opts...)
		warm(t, c.l)
		s, err := c.c.Semaphore(2)
		if err != nil {
			t.Fatal(err)
		}
		return c, s
	}
	v1, s1 := mk(viaProxies(), withTiming(3*time.Second, 0.01), withPriority(0))
	v2, s2 := mk(viaProxies(), withTiming(3*time.Second, 0.01), withPriority(0))
	h, sh := mk(viaProxies(), withTiming(300*time.Millisecond, 0.01), withPriority(1), with(redlockprio.WithCallTimeout(100*time.Millisecond)))
	_, sc1 := mk(withTiming(600*time.Millisecond, 0.01), withPriority(2))
	_, sc2 := mk(withTiming(600*time.Millisecond, 0.01), withPriority(2))
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	var vDeadline time.Duration
	var vdone []<-chan struct{}
	for i, s := range []*redlockprio.Semaphore{s1, s2} {
		l, err := s.TryAcquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		w := hist.Begin([]string{"V1", "V2"}[i], l)
		done := w.Hold(false)
		vdone = append(vdone, done)
		dl := time.Until(l.(*redlockprio.Lease).Deadline()) + hist.Now()
		if vDeadline == 0 || dl < vDeadline {
			vDeadline = dl
		}
	}
	v1.cut()
	v2.cut()
	h.proxies.DelayReplies(400 * time.Millisecond)
	begun := time.Now()
	_, herr := sh.Acquire(ctx, name)
	t.Logf("H's Acquire at %v: %v", ms(hist.Now()), herr)
	if herr == nil {
		t.Skip("H was granted")
	}
	time.Sleep(time.Until(begun.Add(600 * time.Millisecond)))
	logSlots := func() {
		for i, a := range addrs {
			t.Logf("at %v master %d slot 1 %q, slot 2 %q", ms(hist.Now()), i, holderOfSlot(t, a, name, 1), holderOfSlot(t, a, name, 2))
		}
	}
	logSlots()
	type result struct {
		who  string
		at   time.Duration
		slot int
		err  error
	}
	res := make(chan result, 2)
	acquire := func(who string, s *redlockprio.Semaphore) {
		began := hist.Now()
		l, err := s.Acquire(ctx, name)
		if err != nil {
			res <- result{who, hist.Now(), 0, err}
			return
		}
		w := hist.Begin(who, l)
		w.Write(hist.Now())
		w.LetGo()
		slot := l.(interface{ Slot() int }).Slot()
		t.Logf("%s began %v, granted %v in slot %d", who, ms(began), ms(w.Record().Granted), slot)
		res <- result{who, w.Record().Granted, slot, nil}
		time.Sleep(50 * time.Millisecond)
		_ = l.Release(context.Background())
	}
	go acquire("C1", sc1)
	time.Sleep(300 * time.Millisecond)
	logSlots()
	go acquire("C2", sc2)
	time.Sleep(100 * time.Millisecond)
	logSlots()
	for range 2 {
		r := <-res
		t.Logf("%s: at %v slot %d err %v (V's earliest deadline %v)", r.who, ms(r.at), r.slot, r.err, ms(vDeadline))
		if r.err != nil {
			t.Error(r.err)
		} else if r.at < vDeadline {
			t.Errorf("%s granted at %v, %v before the V leases' deadline %v", r.who, ms(r.at), ms(vDeadline-r.at), ms(vDeadline))
		}
	}
	for _, d := range vdone {
		<-d
	}
	t.Logf("sections:\n%v", hist)
	if err := hist.Check(); err != nil {
		t.Error(err)
	}
}

// TestThiefClosedMidStepKeepsVictimsKeys: V (TTL 3s, priority 1) holds and is cut
// off. H (priority 2, TTL 2.5s, call timeout 1s) Locks through proxies
// that delay every reply by 2s, so its acquire has run on the masters
// (taking V's keys, from=V) but no answer has come; H's Client is closed
// 200ms into the step. C (priority 3) Locks 700ms after H began. C must
// not be granted before V's deadline; its grant is logged against it.
func TestThiefClosedMidStepKeepsVictimsKeys(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	v := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
	h := mustClient(t, addrs, viaProxies(), withTiming(2500*time.Millisecond, 0.01), withPriority(2), with(redlockprio.WithCallTimeout(time.Second)))
	c := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(3))
	warm(t, v.l)
	warm(t, h.l)
	warm(t, c.l)
	name := uniqueName(t)
	ctx := ctxFor(t, 20*time.Second)
	vl, err := v.l.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sv := hist.Begin("V", vl)
	done := sv.Hold(false)
	v.cut()
	vDeadline := time.Until(vl.(*redlockprio.Lease).Deadline()) + hist.Now()
	h.proxies.DelayReplies(2 * time.Second)
	begun := time.Now()
	herr := make(chan error, 1)
	go func() {
		_, err := h.l.Lock(ctx, name)
		herr <- err
	}()
	time.Sleep(200 * time.Millisecond)
	for i, a := range addrs {
		t.Logf("at %v master %d holder %q PTTL %v", ms(hist.Now()), i, holderOf(t, a, name), maxPTTL(t, []string{a}, name))
	}
	cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	t.Logf("H closed at %v: %v", ms(hist.Now()), h.c.Close(cctx))
	cancel()
	t.Logf("H's Lock: %v", <-herr)
	time.Sleep(time.Until(begun.Add(700 * time.Millisecond)))
	for i, a := range addrs {
		t.Logf("at %v master %d holder %q PTTL %v", ms(hist.Now()), i, holderOf(t, a, name), maxPTTL(t, []string{a}, name))
	}
	cBegun := hist.Now()
	cl, err := c.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sc := hist.Begin("C", cl)
	sc.Write(hist.Now())
	sc.LetGo()
	_ = cl.Release(ctx)
	<-done
	g := sc.Record().Granted
	t.Logf("V deadline %v, last write %v; C began %v, granted %v (%v after V's deadline)", ms(vDeadline), ms(sv.Record().LastWrite), ms(cBegun), ms(g), ms(g-vDeadline))
	if g < vDeadline {
		t.Errorf("C granted at %v, before V's deadline %v", ms(g), ms(vDeadline))
	}
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}
