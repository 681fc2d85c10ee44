package redlockprio_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// Who may speak for a key: scenarios around vouched ids, "U" answers and
// kept keys (docs/protocols/redlockprio.md, "Displaced but unused keys",
// "Who may speak for a key", "Chain of thieves"). Victims that never
// acknowledge write until their validity deadline (WriteUntilDeadline):
// the docs promise the thief waits for that.

func logKeys(t *testing.T, hist *contracttest.WriteHistory, addrs []string, name string) {
	t.Helper()
	for i, a := range addrs {
		t.Logf("at %v master %d holder %q PTTL %v", ms(hist.Now()), i, holderOf(t, a, name), maxPTTL(t, []string{a}, name))
	}
}

// TestLockContextEndMidStepKeepsVictimsKeys: V (priority 1, TTL 3s) holds
// and is cut off; it writes until its validity deadline. H (priority 2,
// TTL 1s, call timeout 450ms) Locks with a context of 150ms while its
// replies are delayed 300ms (on every master, or on masters 1 and 2 only,
// so that it hears master 0's theft from V in time): its acquire runs on
// the masters (taking V's keys, from=V), but its context ends first. C
// (priority 3, TTL 600ms) Locks 700ms after H began (and, in "late C",
// 1.5s after: after H's TTL and its kept bound for a 1s TTL). C must not
// be granted before V's deadline.
func TestLockContextEndMidStepKeepsVictimsKeys(t *testing.T) {
	for _, v := range []struct {
		name    string
		delayed []int
		cAfter  time.Duration
	}{
		{"no master heard", []int{0, 1, 2}, 700 * time.Millisecond},
		{"master 0 heard", []int{1, 2}, 700 * time.Millisecond},
		{"no master heard/late C", []int{0, 1, 2}, 1500 * time.Millisecond},
		{"master 0 heard/late C", []int{1, 2}, 1500 * time.Millisecond},
	} {
		t.Run(v.name, func(t *testing.T) { lockContextEndMidStep(t, v.delayed, v.cAfter) })
	}
}

func lockContextEndMidStep(t *testing.T, delayed []int, cAfter time.Duration) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	v := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
	h := mustClient(t, addrs, viaProxies(), withTiming(time.Second, 0.01), withPriority(2), with(redlockprio.WithCallTimeout(450*time.Millisecond)))
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
	done := make(chan struct{})
	go func() {
		defer close(done)
		sv.WriteUntilDeadline(nil)
		sv.LetGo()
	}()
	v.cut()
	vDeadline := time.Until(vl.(*redlockprio.Lease).Deadline()) + hist.Now()
	var px testenv.Proxies
	for _, i := range delayed {
		px = append(px, h.proxies[i])
	}
	px.DelayReplies(300 * time.Millisecond)
	begun := time.Now()
	hctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	_, herr := h.l.Lock(hctx, name)
	cancel()
	t.Logf("H's Lock returned at %v: %v", ms(hist.Now()), herr)
	if herr == nil {
		t.Skip("H was granted")
	}
	time.Sleep(time.Until(begun.Add(cAfter)))
	logKeys(t, hist, addrs, name)
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
	t.Logf("V deadline %v, last write %v; C began %v, granted %v (%v after V's deadline)",
		ms(vDeadline), ms(sv.Record().LastWrite), ms(cBegun), ms(g), ms(g-vDeadline))
	if g < vDeadline {
		t.Errorf("C granted at %v, %v before V's deadline %v", ms(g), ms(vDeadline-g), ms(vDeadline))
	}
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}

// TestLostThiefAnswersOnlyAfterItsVictim: V (priority 0, TTL 3s) holds,
// is cut off and writes until its deadline. T (priority 1, TTL 600ms)
// steals and waits for V (which cannot answer) until V's validity has
// run out. 200ms into the wait T is cut off from masters 1 and 2: its
// renewals fail and its lease is lost while it still waits; its keys
// there stay (from=V). U (priority 2, TTL 600ms) Locks 900ms after T
// began (T's lease's deadline has passed; in "U late", 2s after, when
// T's lease's claim may have been forgotten by a renewal round). U must
// not be granted before V's deadline, and should be granted soon after
// it (logged).
func TestLostThiefAnswersOnlyAfterItsVictim(t *testing.T) {
	for _, v := range []struct {
		name   string
		uAfter time.Duration
		tGive  time.Duration // T's Lock context; 0: none
	}{
		{"U while T waits", 900 * time.Millisecond, 0},
		{"U late", 2000 * time.Millisecond, 0},
		{"T gave up/U while T waits", 900 * time.Millisecond, 100 * time.Millisecond},
	} {
		t.Run(v.name, func(t *testing.T) { lostThief(t, v.uAfter, v.tGive) })
	}
}

func lostThief(t *testing.T, uAfter, tGive time.Duration) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	v := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(0))
	th := mustClient(t, addrs, viaProxies(), withTiming(600*time.Millisecond, 0.01), withPriority(1))
	u := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(2))
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
	done := make(chan struct{})
	go func() {
		defer close(done)
		sv.WriteUntilDeadline(nil)
		sv.LetGo()
	}()
	v.cut()
	vDeadline := time.Until(vl.(*redlockprio.Lease).Deadline()) + hist.Now()
	type result struct {
		at  time.Duration
		err error
	}
	tres := make(chan result, 1)
	begun := time.Now()
	go func() {
		tctx := ctx
		if tGive > 0 {
			var cancel context.CancelFunc
			tctx, cancel = context.WithTimeout(ctx, tGive)
			defer cancel()
		}
		tl, err := th.l.Lock(tctx, name)
		if err != nil {
			tres <- result{hist.Now(), err}
			return
		}
		st := hist.Begin("T", tl)
		st.WriteWhileLive(nil)
		st.LetGo()
		_ = tl.Release(context.Background())
		tres <- result{st.Record().Granted, nil}
	}()
	time.Sleep(200 * time.Millisecond)
	logKeys(t, hist, addrs, name)
	testenv.Proxies(th.proxies[1:]).Cut()
	t.Logf("T cut from masters 1 and 2 at %v", ms(hist.Now()))
	time.Sleep(time.Until(begun.Add(uAfter)))
	logKeys(t, hist, addrs, name)
	uBegun := hist.Now()
	ul, err := u.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	su := hist.Begin("U", ul)
	su.Write(hist.Now())
	su.LetGo()
	_ = ul.Release(ctx)
	r := <-tres
	<-done
	g := su.Record().Granted
	t.Logf("V deadline %v, last write %v; T's Lock returned %v: %v; U began %v, granted %v (%v after V's deadline)",
		ms(vDeadline), ms(sv.Record().LastWrite), ms(r.at), r.err, ms(uBegun), ms(g), ms(g-vDeadline))
	if r.err == nil && r.at < vDeadline {
		t.Errorf("T granted at %v, before V's deadline %v", ms(r.at), ms(vDeadline))
	}
	if g < vDeadline {
		t.Errorf("U granted at %v, %v before V's deadline %v", ms(g), ms(vDeadline-g), ms(vDeadline))
	}
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}

// TestShortThiefOfLongVictimVouchesPastItsTTL: V (priority 0, TTL 3s)
// holds and lets go at once when preempted. T (priority 1, TTL 300ms)
// steals; its keys take V's PTTL (~3s, from=V). T is granted once V
// acknowledged, writes, and releases with its links to masters 0 and 1
// cut: its keys there stay (PTTL ~3s), so U needs one of them. After a gap (longer than T's TTL plus
// drift, shorter than the key's PTTL) U (priority 2) Locks: it tells T,
// which let go. U's wait is checked against the bound for a victim that
// has let go.
func TestShortThiefOfLongVictimVouchesPastItsTTL(t *testing.T) {
	for _, gap := range []time.Duration{50 * time.Millisecond, 700 * time.Millisecond, 1500 * time.Millisecond} {
		t.Run(fmt.Sprintf("gap %v", gap), func(t *testing.T) { shortThiefLongVictim(t, gap) })
	}
}

func shortThiefLongVictim(t *testing.T, gap time.Duration) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	v := mustClient(t, addrs, withTiming(3*time.Second, 0.01), withPriority(0))
	th := mustClient(t, addrs, viaProxies(), withTiming(300*time.Millisecond, 0.01), withPriority(1))
	u := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(2))
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
	time.Sleep(150 * time.Millisecond) // a renewal or so
	st.Write(hist.Now())
	st.LetGo()
	testenv.Proxies(th.proxies[:2]).Cut()
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	rerr := tl.Release(rctx)
	cancel()
	t.Logf("T released at %v: %v", ms(hist.Now()), rerr)
	logKeys(t, hist, addrs, name)
	time.Sleep(gap)
	logKeys(t, hist, addrs, name)
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
	t.Logf("U waited %v for T (U began %v after T released)", waited, gap)
	bound.Check(t, "U's wait for T, which had let go (Release) before U began,", waited)
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}

// TestLostThiefLeaseAnswersWhenItsHolderLetsGo: V (priority 0, TTL
// 600ms) holds and lets go when preempted; T (priority 1, TTL 3s) steals
// and is granted (its keys have from=V). T's holder then writes until its
// validity deadline, whatever its context says. T is cut off from masters
// 1 and 2: its renewals fail and its lease is lost (ErrLost) before its
// deadline; its keys there stay. U (priority 2, TTL 600ms) Locks once T's
// lease has ended: it takes T's keys and must not be granted before T's
// deadline (T never released). In "T releases", T's holder releases
// 50ms after U began (U should then be granted within 200ms of it; T is
// lost only near its deadline, when the renewals give up).
func TestLostThiefLeaseAnswersWhenItsHolderLetsGo(t *testing.T) {
	for _, release := range []bool{false, true} {
		t.Run(map[bool]string{false: "T writes to its deadline", true: "T releases"}[release], func(t *testing.T) {
			lostThiefLease(t, release)
		})
	}
}

func lostThiefLease(t *testing.T, release bool) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	hist := contracttest.NewWriteHistory()
	v := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(0))
	th := mustClient(t, addrs, viaProxies(), withTiming(3*time.Second, 0.01), withPriority(1))
	u := mustClient(t, addrs, withTiming(600*time.Millisecond, 0.01), withPriority(2))
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
	tl, err := th.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	st := hist.Begin("T", tl)
	<-vdone
	stop := make(chan struct{})
	tdone := make(chan struct{})
	go func() {
		defer close(tdone)
		st.WriteUntilDeadline(stop)
		st.LetGo()
		_ = tl.Release(context.Background())
	}()
	testenv.Proxies(th.proxies[1:]).Cut()
	t.Logf("T granted %v, cut from masters 1 and 2 at %v", ms(st.Record().Granted), ms(hist.Now()))
	select {
	case <-tl.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("T's lease did not end")
	}
	tDeadline := time.Until(tl.(*redlockprio.Lease).Deadline()) + hist.Now()
	t.Logf("T's lease ended at %v: %v; its deadline %v", ms(hist.Now()), context.Cause(tl.Context()), ms(tDeadline))
	logKeys(t, hist, addrs, name)
	uBegun := hist.Now()
	if release {
		time.AfterFunc(50*time.Millisecond, func() { close(stop) })
	}
	ul, err := u.l.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	su := hist.Begin("U", ul)
	su.Write(hist.Now())
	su.LetGo()
	_ = ul.Release(ctx)
	<-tdone
	g := su.Record().Granted
	xt := st.Record()
	t.Logf("T last write %v, let go %v, deadline %v; U began %v, granted %v (%v after T let go)",
		ms(xt.LastWrite), ms(xt.LetGo), ms(tDeadline), ms(uBegun), ms(g), ms(g-xt.LetGo))
	if !release && g < tDeadline {
		t.Errorf("U granted at %v, before T's deadline %v", ms(g), ms(tDeadline))
	}
	if release && g-xt.LetGo > 200*time.Millisecond {
		t.Errorf("U granted %v after T let go (Release)", ms(g-xt.LetGo))
	}
	if err := hist.Check(); err != nil {
		t.Logf("sections:\n%v", hist)
		t.Error(err)
	}
}
