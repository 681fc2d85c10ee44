package natsputex_test

// Attack round 7 (see attack7_test.go), continued: writes waiting for a
// reconnect across a NATS server restart (the nats-server program on
// PATH, 2.9.10 on the reference machine), a bucket wiped while they wait,
// and a node restart in a 3-node cluster of that program.

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// takeAcrossFault runs a Lock (ctx 15s, C = 1) of key on a client of
// connection nc whose Standby health check, once the ghost's key is due
// for a takeover, calls fault (and waits for nats.go to reconnect); then
// heal. It checks that Lock returns the lease, its write T after the
// ghost's and after the fault, and Lock C·R after that write, with the
// writes read from hist (the bucket's history) once done.
func takeAcrossFault(t *testing.T, nc *nats.Conn, js jetstream.JetStream, kv jetstream.KeyValue, hist *historyLog, bucket, key string, fault, heal func()) {
	t.Helper()
	const T = testF * testR
	var armed atomic.Pointer[time.Time]
	r0 := nc.Stats().Reconnects
	hc, faults := faultHook(&armed, fault, func() bool { return nc.IsReconnecting() || nc.Stats().Reconnects > r0 })
	taker := newClientOn(t, nc, js, bucket, natsputex.WithHolderID("taker"), natsputex.WithHealthCheck(hc))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := kv.Put(ctx, key, []byte("ghost")); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	from := e.Created().Add(T - 30*time.Millisecond)
	armed.Store(&from)
	got := goLock(ctx, taker.Locker(), key, false)
	var at time.Time
	select {
	case at = <-faults:
	case o := <-got:
		hist.collect()
		for _, kw := range hist.watch().all() {
			t.Logf("rev %d %q %v after the ghost's write", kw.rev, kw.value, ms(kw.created.Sub(e.Created())))
		}
		t.Fatalf("Lock returned (lease %v, token %d, %v) %v after the ghost's write, before its Standby check", o.lease != nil, tokenOf(o.lease), o.err, ms(o.at.Sub(e.Created())))
	case <-time.After(5 * time.Second):
		t.Fatal("no Standby health check before the takeover")
	}
	healStart := time.Now()
	heal()
	healed := time.Now()
	o := waitOutcome(t, got, 16*time.Second, "the Lock")
	t.Logf("fault %v after the ghost's write; healed %v after the fault (took %v); Lock returned %v after the fault: lease %v, err %v",
		ms(at.Sub(e.Created())), ms(healed.Sub(at)), ms(healed.Sub(healStart)), ms(o.at.Sub(at)), o.lease != nil, o.err)
	if o.err != nil {
		t.Fatalf("Lock (ctx 15s) failed across the fault: %v", o.err)
	}
	defer func() { _ = o.lease.Release(context.Background()) }()
	hist.collect()
	var w keyWrite
	for _, kw := range hist.watch().all() {
		if kw.rev == o.lease.Token() {
			w = kw
		}
	}
	if !strings.HasPrefix(w.value, "taker") {
		t.Fatalf("the lease's token %d is not a write of the taker's in the key's history (%q)", o.lease.Token(), w.value)
	}
	t.Logf("the takeover write rev %d stored %v after the fault, %v after the ghost's; Lock returned %v after it", w.rev, ms(w.created.Sub(at)), ms(w.created.Sub(e.Created())), ms(o.at.Sub(w.created)))
	if d := w.created.Sub(e.Created()); d < T-10*time.Millisecond {
		t.Errorf("the taker took the key %v after the ghost's write, before T = %v", ms(d), T)
	}
	if !w.created.After(at) {
		t.Errorf("the takeover write landed before the fault: the path was not exercised")
	}
	if d := o.at.Sub(w.created); d < testC*testR-10*time.Millisecond {
		t.Errorf("Lock returned %v after its takeover write was stored, before C·R = %v", ms(d), testC*testR)
	}
}

// TestAttack7ServerRestartTake: ConnectOptions: "natsputex sends such a
// write again itself once the connection is back, while the write's own
// bound lasts"; C is "counted from the answer to its takeover write
// (which may land well after it was begun, when it waited for a
// reconnect)". A key written by hand ("ghost"); a client on ConnectOptions
// (R = 100ms, F = 3, C = 1) waits in Lock; its Standby health check, run
// before the takeover write, shuts the NATS server (nats-server on PATH,
// file storage) down and returns once nats.go reconnects; the server is
// started again at once. Lock must return the lease: its write stored
// after the shutdown, T after the ghost's, Lock returning C·R after it.
func TestAttack7ServerRestartTake(t *testing.T) {
	srv, url, bucket, key := binaryEnv6(t, "atk7restart")
	nc, js, err := connect(url, natsputex.ConnectOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	kv := mustBucket(t, url, bucket)
	takeAcrossFault(t, nc, js, kv, newHistoryLog(t, url, bucket, key), bucket, key, srv.Shutdown, func() {
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestAttack7ClusterRestartTake: the same on a 3-node cluster of the
// nats-server program (2.9.10: a single-replica bucket, which New accepts
// on it), the taker connected (ConnectOptions, every node's URL, its node
// first) to the node its Standby check shuts down, which is started again
// (Cluster.Restart: back once current). "other-node": the bucket's stream
// lives on another node, and nats.go reconnects to one of the others;
// "stream-node": on the node restarted, so no write is answered until it
// is back. Lock (ctx 15s) must return the lease with the bounds above.
func TestAttack7ClusterRestartTake(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	cluster, bucket, sn := binaryClusterBucket(t, "atk7cluster")
	servers := cluster.Servers()
	for _, tc := range []struct {
		name string
		node int
	}{{"other-node", (sn + 1) % 3}, {"stream-node", sn}} {
		t.Run(tc.name, func(t *testing.T) {
			key := "job-" + tc.name
			i := tc.node
			var ordered []string
			for j := range servers {
				ordered = append(ordered, servers[(i+j)%3].URL())
			}
			nc, js, err := connect(strings.Join(ordered, ","), append(natsputex.ConnectOptions(), nats.DontRandomize())...)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("the stream lives on %s; the taker is on %s, which is restarted", servers[sn].Name(), servers[i].Name())
			admin := servers[(i+1)%3].URL()
			if i != sn {
				admin = servers[sn].URL()
			}
			kv := mustBucket(t, admin, bucket)
			takeAcrossFault(t, nc, js, kv, newHistoryLog(t, admin, bucket, key), bucket, key, func() { cluster.Stop(i) }, func() {
				if err := cluster.Restart(i); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// binaryClusterBucket starts a 3-node cluster of the nats-server program
// (with a leak check) and makes a single-replica bucket with a history of
// 64 values on it; it returns the bucket and the index of the node its
// stream lives on.
func binaryClusterBucket(t *testing.T, prefix string) (cluster *natsenv.Cluster, bucket string, streamNode int) {
	t.Helper()
	checkLeaks6(t)
	cluster = natsenv.StartBinaryCluster(t, 3)
	urls, bucket := cluster.URLs(), uniqueBucket(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := mustJS(t, urls).CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 64}); err != nil {
		t.Fatal(err)
	}
	streamNode = awaitBucketLeader(t, urls, bucket, cluster.Servers(), func(_ context.Context, _ *nats.Conn, info *jetstream.ClusterInfo, leader int) error {
		if leader < 0 {
			return errors.New("no stream node yet: " + info.Leader)
		}
		return nil
	})
	return cluster, bucket, streamNode
}

// TestAttack7BucketWiped: ConnectOptions: a refused write is sent again
// once the connection is back; package doc: a key that vanishes (the
// bucket made again, a memory bucket whose servers restarted) "is not free
// at once to a caller that saw it before: a waiting call, or a running
// Supervisor, that saw the key counts it as held for T ... and takes it
// only after T of silence and C·R of confirmation"; "The old holder's next
// renewal fails (a write at its revision, which the new bucket does not
// have), so it learns within R". node-a (a Supervisor, R = 100ms, F = 10,
// C = 1) is active and its client holds a Locker lease ("job"); node-b
// stands by and another client waits in Lock for "job" (backoff 20s, so
// that no poll runs while nats.go reconnects: see
// TestAttack7WaitingLockAcrossCut).
//   - remade-behind-cut (local server, memory bucket): node-a's link is
//     cut halfway between two renewals, the bucket deleted and made again
//     meanwhile, the link restored 250ms after the cut: node-a's renewals,
//     refused while it reconnected and sent again into the new bucket,
//     must be refused there.
//   - memory-restart (nats-server on PATH, memory bucket): the server is
//     restarted (it comes back without the bucket) and the bucket made
//     again at once, every client reconnecting.
//
// In both: node-a's Stop and the lease's end must come within R (+60ms)
// of its reconnect (or before); no write of node-a's or of the lease's
// may land in the new bucket before another's; node-b and the waiter take
// the keys only T after node-a's and the lease's last writes in the old
// bucket (the old lease's token never written in the new one), the
// waiter's lease granted only once the old one ended; the services never
// overlap. (Tokens start from 1 again in the new bucket: documented.)
func TestAttack7BucketWiped(t *testing.T) {
	const (
		F = 10
		T = F * testR
	)
	for _, mode := range []string{"remade-behind-cut", "memory-restart"} {
		t.Run(mode, func(t *testing.T) {
			var url, aURL, bucket, key string
			var srv *natsenv.Server
			var l *link7
			if mode == "memory-restart" {
				checkLeaks6(t)
				srv = natsenv.StartBinaryServer(t)
				url, bucket, key = srv.URL(), uniqueBucket("atk7wipe"), "spof-service"
				prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
				aURL = url
			} else {
				url, bucket, key = atk4Env(t)
				l = dial7(t, url)
				aURL = "nats://" + l.proxy.Addr()
			}
			old := map[string]*keyWatch{key: watchWrites(t, url, bucket, key), "job": watchWrites(t, url, bucket, "job")}
			h := contracttest.NewHistory(1)
			opts := []natsputex.Option{natsputex.WithFailureThreshold(F)}
			a, b := activeAndStandby(t, aURL, url, bucket, key, h, 20*time.Millisecond, opts...)
			lease, err := a.c.Locker().TryLock(context.Background(), "job")
			if err != nil {
				t.Fatal(err)
			}
			endedAt := make(chan time.Time, 1)
			go func() { <-lease.Context().Done(); endedAt <- time.Now() }()
			token := writeAt(t, old["job"], lease.Token()).value
			wnc, wjs, err := connect(url, natsputex.ConnectOptions()...)
			if err != nil {
				t.Fatal(err)
			}
			waiter := newClientOn(t, wnc, wjs, bucket, append(opts, natsputex.WithHolderID("waiter"), natsputex.WithBackoff(locks.Backoff{Min: 20 * time.Second, Max: 20 * time.Second}))...)
			wctx, wcancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer wcancel()
			waiting := goLock(wctx, waiter.Locker(), "job", false)
			time.Sleep(3 * testR)
			var fault time.Time
			var fresh map[string]*keyWatch
			remake := func() {
				deleteBucket(url, bucket)
				prepareBucket(t, url, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
				fresh = map[string]*keyWatch{key: watchWrites(t, url, bucket, key), "job": watchWrites(t, url, bucket, "job")}
			}
			if mode == "memory-restart" {
				fault = afterRenewal(t, old[key], "node-a", testR/2, func() {
					if err := srv.Restart(); err != nil {
						t.Fatal(err)
					}
					remake()
				})
			} else {
				fault = cutAfterRenewal(t, old[key], "node-a", l.proxy.Cut)
				waitFor(t, 2*time.Second, "node-a's connection reconnects", a.nc.IsReconnecting)
				remake()
				time.Sleep(time.Until(fault.Add(250 * time.Millisecond)))
				l.proxy.Restore()
			}
			waitFor(t, 3*time.Second, "node-a's connection is back", a.nc.IsConnected)
			back := time.Now()
			lastA, _ := old[key].lastBy("node-a", fault)
			lastL, _ := old["job"].lastBy(token, fault)
			waitFor(t, 3*time.Second, "node-a stops", func() bool { _, ok := a.firstStopAfter(fault); return ok })
			var ended time.Time
			select {
			case ended = <-endedAt:
			case <-time.After(3 * time.Second):
				t.Fatal("the lease did not end")
			}
			stop, _ := a.firstStopAfter(fault)
			w := waitOutcome(t, waiting, 10*time.Second, "the waiter's Lock")
			if w.err != nil {
				t.Fatalf("the waiter's Lock: %v", w.err)
			}
			defer func() { _ = w.lease.Release(context.Background()) }()
			if w.at.Before(ended) {
				t.Errorf("the waiter got the lease %v before the old lease ended", ms(ended.Sub(w.at)))
			}
			waitActive4(t, 5*time.Second, a, b)
			time.Sleep(T + testC*testR)
			stopNodes(a, b)
			t.Logf("%s: back %v after the fault; node-a's Stop %v after it, the lease ended %v after it (%v)", mode, ms(back.Sub(fault)), ms(stop.begin.Sub(back)), ms(ended.Sub(back)), context.Cause(lease.Context()))
			if d := stop.begin.Sub(back); d > testR+slack6 {
				t.Errorf("node-a began Stop %v after its connection was back, later than R (+%v)", ms(d), slack6)
			}
			if d := ended.Sub(back); d > testR+slack6 {
				t.Errorf("the lease ended %v after its connection was back, later than R (+%v)", ms(d), slack6)
			}
			if !errors.Is(context.Cause(lease.Context()), locks.ErrLost) {
				t.Errorf("the lease ended with %v, not ErrLost", context.Cause(lease.Context()))
			}
			for k, lastOld := range map[string]keyWrite{key: lastA, "job": lastL} {
				ws := fresh[k].all()
				for i, fw := range ws {
					t.Logf("  new bucket %q: rev %d %q %v after the old holder's last write", k, fw.rev, fw.value, ms(fw.created.Sub(lastOld.created)))
					if i > 3 {
						break
					}
				}
				if len(ws) == 0 {
					t.Errorf("nothing was written to %q in the new bucket", k)
					continue
				}
				for _, fw := range ws {
					if fw.value == lastOld.value && fw.created.Before(lastOld.created.Add(T)) {
						t.Errorf("the old holder's %q was written in the new bucket (rev %d) %v after its last write in the old one: a write sent again into the new bucket landed", fw.value, fw.rev, ms(fw.created.Sub(lastOld.created)))
					}
				}
				if d := ws[0].created.Sub(lastOld.created); d < T-10*time.Millisecond {
					t.Errorf("%q was taken in the new bucket (rev %d %q) %v after the old holder's last write, before T = %v", k, ws[0].rev, ws[0].value, ms(d), T)
				}
			}
			if err := h.Check(); err != nil {
				t.Errorf("services overlapped: %v", err)
			}
		})
	}
}

func tokenOf(l locks.Lease) uint64 {
	if l == nil {
		return 0
	}
	return l.Token()
}
