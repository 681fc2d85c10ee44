package natsputex_test

// Attack round 7 (see attack7_test.go), continued: the event of a
// Supervisor whose renewal is refused because someone else wrote the key.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

// stoppedEvent returns n's first event at or after since that ends its
// hold (phase standby, "…: service stopped").
func stoppedEvent(n *node4, since time.Time) (natsputex.Event, bool) {
	for _, e := range eventsAfter(n, since) {
		if e.Phase == natsputex.PhaseStandby && strings.HasSuffix(e.Msg, "service stopped") {
			return e, true
		}
	}
	return natsputex.Event{}, false
}

// TestAttack7RefusedRenewalEvent: Event: "Holder string // the holder's
// token in the key (without the timing a Supervisor writes after it), when
// it was read; "" when free", "Revision uint64 // the key's revision, when
// known"; an agent renews "at the revision of its own last write (and
// reads the key when that write finds it taken, to say who took it)"; "an
// agent holding the key that finds its token written by someone else
// stops its service and says so". node-a (R = 100ms, F = 10, C = 1) is
// active; halfway between two renewals (or right after one) the key is
// written behind its back:
//   - other-agent: blanked by hand right after a renewal, node-b (standby)
//     takes the free key at once: the event must name node-b and its
//     revision.
//   - raw-write: "intruder" put by hand: Holder "intruder", its revision.
//   - blank, delete, purge (node-a alone): Holder "", the blank's, delete
//     marker's or purge marker's revision (0 allowed for the markers:
//     "when known").
//   - same-token: node-a2, a second agent given node-a's token, stands by;
//     the key is blanked right after a renewal and node-a2 takes it:
//     Holder "node-a", node-a2's revision.
//   - moved-after-refusal: node-a's answers are held 150ms by its proxy;
//     "intruder" is put, node-a's next renewal is refused (its answer
//     held), "second" is put and the held answers delivered: node-a reads
//     after "second", so Holder and Revision must name one write (the
//     read's), never the token of one and the revision of another.
//   - slow-read: the same without "second", every answer held 150ms:
//     node-a's read may not be answered in time; a Revision of 0
//     (unknown) then needs Holder "" (logged: the doc says "" when free).
//   - resent-after-reconnect: node-a's link is cut, "intruder" put, the
//     link restored 250ms after the cut: node-a's renewal, refused while
//     it reconnected and sent again, is refused by the server: Holder
//     "intruder", its revision.
//
// In every case the event's phase is standby, its message ends with
// "service stopped", its Revision is the foreign write's or a later one,
// and its Holder is the token the key held at that Revision; node-a's
// Stop begins within R (+60ms) of the refusal being possible (the foreign
// write, or the reconnect).
func TestAttack7RefusedRenewalEvent(t *testing.T) {
	const F = 10
	for _, mode := range []string{"other-agent", "raw-write", "blank", "delete", "purge", "same-token", "moved-after-refusal", "slow-read", "resent-after-reconnect"} {
		t.Run(mode, func(t *testing.T) {
			p := newProxied7(t)
			url, bucket, key, writes, h := p.url, p.bucket, p.key, p.writes, p.h
			kv := mustBucket(t, url, bucket)
			opts := []natsputex.Option{natsputex.WithFailureThreshold(F)}
			aURL := url
			var proxy *testenv.Proxy
			if mode == "moved-after-refusal" || mode == "slow-read" || mode == "resent-after-reconnect" {
				proxy, aURL = p.proxy, p.addr()
			}
			a := startNode5(t, aURL, bucket, key, "node-a", "node-a", h, true, opts...)
			a.stopDelay.Store(int64(20 * time.Millisecond))
			waitFor(t, 5*time.Second, "node-a starts its service", a.running)
			var other *node4
			switch mode {
			case "other-agent":
				other = startNode5(t, url, bucket, key, "node-b", "node-b", h, true, opts...)
			case "same-token":
				other = startNode5(t, url, bucket, key, "node-a2", "node-a", h, true, opts...)
			}
			if other != nil {
				waitFor(t, 5*time.Second, other.name+" is standby", func() bool {
					return other.sawEvent(func(e natsputex.Event) bool { return e.Holder == "node-a" && e.Phase == natsputex.PhaseStandby })
				})
			}
			time.Sleep(3 * testR)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			put := func(v string) uint64 {
				rev, err := kv.Put(ctx, key, []byte(v))
				if err != nil {
					t.Fatal(err)
				}
				return rev
			}
			var foreign uint64
			var possible, fault time.Time
			want := ""
			switch mode {
			case "other-agent", "same-token":
				fault = afterRenewal(t, writes, "node-a", 0, func() { foreign = put("") })
				want = "node-b"
				if mode == "same-token" {
					want = "node-a"
				}
			case "raw-write":
				fault = cutAfterRenewal(t, writes, "node-a", func() { foreign = put("intruder") })
				want = "intruder"
			case "blank":
				fault = cutAfterRenewal(t, writes, "node-a", func() { foreign = put("") })
			case "delete", "purge":
				fault = cutAfterRenewal(t, writes, "node-a", func() {
					var err error
					if mode == "delete" {
						err = kv.Delete(ctx, key)
					} else {
						err = kv.Purge(ctx, key)
					}
					if err != nil {
						t.Fatal(err)
					}
				})
			case "moved-after-refusal", "slow-read":
				var first uint64
				fault = afterRenewal(t, writes, "node-a", 0, func() {
					proxy.DelayReplies(150 * time.Millisecond)
					time.Sleep(20 * time.Millisecond)
					first = put("intruder")
					time.Sleep(testR + 40*time.Millisecond)
					if mode == "moved-after-refusal" {
						put("second")
						proxy.Restore()
						possible = time.Now()
					}
				})
				foreign, want = first, "?"
			case "resent-after-reconnect":
				fault = cutAfterRenewal(t, writes, "node-a", proxy.Cut)
				waitFor(t, 2*time.Second, "node-a's connection reconnects", a.nc.IsReconnecting)
				time.Sleep(30 * time.Millisecond)
				foreign = put("intruder")
				time.Sleep(time.Until(fault.Add(250 * time.Millisecond)))
				proxy.Restore()
				waitFor(t, 3*time.Second, "node-a's connection is back", a.nc.IsConnected)
				possible = time.Now()
				want = "intruder"
			}
			if foreign == 0 {
				waitFor(t, 2*time.Second, "the watch sees the foreign write", func() bool { return len(writes.writesAfter(fault.Add(-2*time.Millisecond))) > 0 })
				foreign = writes.writesAfter(fault.Add(-2 * time.Millisecond))[0].rev
			}
			fw := writeAt(t, writes, foreign)
			if possible.IsZero() {
				possible = fw.created
			}
			waitFor(t, 5*time.Second, "node-a's hold ends", func() bool { _, ok := stoppedEvent(a, fault); return ok })
			e, _ := stoppedEvent(a, fault)
			stop, _ := a.firstStopAfter(fault)
			if proxy != nil {
				proxy.Restore()
			}
			time.Sleep(2 * testR)
			byRev := map[uint64]keyWrite{}
			for _, w := range writes.all() {
				byRev[w.rev] = w
			}
			read, known := byRev[e.Revision]
			t.Logf("%s: foreign write rev %d %q; node-a's event: phase=%v holder=%q revision=%d (the key held %q there) msg=%q; Stop began %v after the refusal was possible",
				mode, fw.rev, fw.value, e.Phase, e.Holder, e.Revision, read.value, e.Msg, ms(stop.begin.Sub(possible)))
			switch {
			case e.Revision == 0 && (mode == "delete" || mode == "purge" || mode == "slow-read"):
				if e.Holder != "" {
					t.Errorf("the event names holder %q with no revision, for a %s key", e.Holder, mode)
				}
			case e.Revision < foreign:
				t.Errorf("the event's Revision %d is older than the foreign write's %d", e.Revision, foreign)
			case !known:
				t.Errorf("the event's Revision %d is no write of the key's", e.Revision)
			case read.value != e.Holder:
				t.Errorf("the event's Holder %q is not what the key held at its Revision %d (%q)", e.Holder, e.Revision, read.value)
			}
			if want != "?" && e.Holder != want {
				t.Errorf("the event's Holder is %q, want %q", e.Holder, want)
			}
			if d := stop.begin.Sub(possible); mode != "slow-read" && (stop.begin.IsZero() || d > testR+slack6) {
				t.Errorf("node-a began Stop %v after the refusal was possible, later than R (+%v)", ms(d), slack6)
			}
			stopNodes(a)
			if other != nil {
				stopNodes(other)
			}
			if mode == "raw-write" || mode == "resent-after-reconnect" {
				if err := h.Check(); err != nil {
					t.Errorf("services overlapped: %v", err)
				}
			}
		})
	}
}
