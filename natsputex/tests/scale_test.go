package natsputex_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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

// Waiting that scales (issue 26): a crowd of Locks on one name is served
// one at a time, each in turn, at a cost per hand-off that does not grow
// with the crowd. The file keeps its own helpers (prefixed scale) so that
// it depends on no other file of the package.

// scaleTiming is the timing of this file's clients: T = 1.5s, so that a
// head stalled by a loaded machine keeps its turn.
var scaleTiming = natsputex.WithRenewInterval(500 * time.Millisecond)

// scaleConn is one connection of a test's, closed at cleanup.
func scaleConn(t testing.TB, urls string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(urls, append(natsputex.ConnectOptions(), nats.MaxReconnects(-1))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// scaleClient is a natsputex client on a connection of its own, closed
// (the client, then the connection) at cleanup.
func scaleClient(t testing.TB, urls, bucket string, opts ...natsputex.Option) (*natsputex.Client, *nats.Conn) {
	t.Helper()
	nc, js := scaleConn(t, urls)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := natsputex.New(ctx, js, bucket, append([]natsputex.Option{scaleTiming}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c, nc
}

var scaleBuckets atomic.Int64

func scaleBucket(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, scaleBuckets.Add(1))
}

// scaleQueue returns the info of the bucket's queue consumer (one per
// name and T: these tests use one name and one T).
func scaleQueue(ctx context.Context, js jetstream.JetStream, bucket string) (*jetstream.ConsumerInfo, error) {
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, err
	}
	names := st.ConsumerNames(ctx)
	var found string
	for name := range names.Name() {
		if strings.HasPrefix(name, "natsputex_turn_") {
			found = name
		}
	}
	if err := names.Err(); err != nil {
		return nil, err
	}
	if found == "" {
		return nil, errors.New("no queue consumer yet")
	}
	c, err := st.Consumer(ctx, found)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// scaleAwaitQueue polls until the queue has a head and waiting pull
// requests behind it, for up to a minute.
func scaleAwaitQueue(t *testing.T, js jetstream.JetStream, bucket string, waiting int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := scaleQueue(ctx, js, bucket)
		cancel()
		if err == nil && info.NumAckPending == 1 && info.NumWaiting == waiting {
			return
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("%d delivered unacknowledged, %d waiting; want 1, %d", info.NumAckPending, info.NumWaiting, waiting)
			}
			t.Fatalf("the queue does not form: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// scaleGrant is one lease won by a waiter of a burst.
type scaleGrant struct {
	who       int
	token     uint64
	at, freed time.Time // when Lock returned, and when its Release did
}

// TestQueueScaleBurst: 128 Locks on one held name, on one client, on 8
// clients, and on a client each (and on 8 clients of a 3-node cluster,
// unless -short), all queued before the holder releases. Every one gets
// the lock once, in turn: never two at once (contracttest.History),
// tokens rising. A release wakes the head at once (the documented bound
// of a hand-off adds nothing to the slack: docs/protocols/natsputex.md),
// so the waiter served k-th waits at most k times the hold plus the
// slack measured at the start, counted from the release.
func TestQueueScaleBurst(t *testing.T) {
	const waiters = 128
	single := natsenv.StartServer(t).URL()
	cases := []struct {
		name    string
		urls    string
		clients int
		opts    []natsputex.Option
	}{
		{"one client", single, 1, nil},
		{"8 clients", single, 8, nil},
		{"a client each", single, waiters, nil},
	}
	if !testing.Short() {
		cases = append(cases, struct {
			name    string
			urls    string
			clients int
			opts    []natsputex.Option
		}{"8 clients on a cluster", natsenv.StartCluster(t, 3).URLs(), 8, []natsputex.Option{natsputex.WithReplicas(3)}})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bucket := scaleBucket("burst")
			holderClient, _ := scaleClient(t, tc.urls, bucket, tc.opts...)
			lockers := make([]*natsputex.Locker, tc.clients)
			for i := range lockers {
				c, _ := scaleClient(t, tc.urls, bucket, tc.opts...)
				lockers[i] = c.Locker()
			}
			_, adminJS := scaleConn(t, tc.urls)
			kv, err := adminJS.KeyValue(t.Context(), bucket)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			holder, err := holderClient.Locker().TryLock(ctx, "job")
			if err != nil {
				t.Fatal(err)
			}
			const hold = time.Millisecond
			hist := contracttest.NewHistory(1)
			grants := make(chan scaleGrant, waiters)
			errc := make(chan error, waiters)
			var wg sync.WaitGroup
			for i := range waiters {
				l := lockers[i%len(lockers)]
				wg.Go(func() {
					lease, err := l.Lock(ctx, "job")
					if err != nil {
						errc <- fmt.Errorf("waiter %d: %w", i, err)
						return
					}
					g := scaleGrant{who: i, token: lease.Token(), at: time.Now()}
					exit := hist.Enter(fmt.Sprint(i), lease.Token())
					time.Sleep(hold)
					exit()
					if err := lease.Release(ctx); err != nil && !errors.Is(err, locks.ErrLost) {
						errc <- fmt.Errorf("waiter %d: release: %w", i, err)
					}
					g.freed = time.Now()
					grants <- g
				})
			}
			// One waiter is the head, the others wait behind it.
			scaleAwaitQueue(t, adminJS, bucket, waiters-1)
			b := contracttest.MeasureBound(t, 0, func() error {
				_, err := kv.Get(ctx, "job")
				return err
			})
			released := time.Now()
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			close(errc)
			close(grants)
			for err := range errc {
				t.Error(err)
			}
			var got []scaleGrant
			for g := range grants {
				got = append(got, g)
			}
			slices.SortFunc(got, func(a, b scaleGrant) int { return a.at.Compare(b.at) })
			if len(got) != waiters {
				t.Fatalf("%d of %d waiters got the lock", len(got), waiters)
			}
			took := got[len(got)-1].at.Sub(released)
			t.Logf("%d waiters on %d clients served in %v: %.0f hand-offs/s; slack per hand-off %v",
				waiters, tc.clients, took.Round(time.Millisecond), float64(waiters)/took.Seconds(), b)
			if err := hist.Check(); err != nil {
				t.Error(err)
			}
			for k, g := range got {
				if k > 0 && g.token <= got[k-1].token {
					t.Errorf("grant %d (waiter %d) has token %d, not above the one before it (%d)", k+1, g.who, g.token, got[k-1].token)
				}
				limit := time.Duration(k+1) * (hold + b.Limit())
				if wait := g.at.Sub(released); wait > limit {
					t.Errorf("the waiter served %d-th (waiter %d) waited %v after the release, over %d × (hold %v + %v)",
						k+1, g.who, wait, k+1, hold, b)
				}
			}
		})
	}
}

// BenchmarkQueueHandoffs: clients on a connection each lock one name in a
// loop (a 100µs critical section, as lockbench's contended scenario) on
// one embedded node, b.N grants in all; it reports grants per second,
// the messages the clients published and received per grant, and the
// knocks and releases' words among them.
func BenchmarkQueueHandoffs(b *testing.B) {
	url := natsenv.StartServer(b).URL()
	for _, n := range []int{8, 256, 1000} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			bucket := scaleBucket("bench")
			lockers := make([]*natsputex.Locker, n)
			conns := make([]*nats.Conn, n)
			for i := range lockers {
				c, nc := scaleClient(b, url, bucket, natsputex.WithRenewInterval(time.Second))
				lockers[i], conns[i] = c.Locker(), nc
			}
			stats := func() (out, in uint64) {
				for _, nc := range conns {
					s := nc.Stats()
					out, in = out+s.OutMsgs, in+s.InMsgs
				}
				return out, in
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			var left atomic.Int64
			left.Store(int64(b.N))
			// The knock subjects carry the heads' knocks (empty) and the
			// releases' word of the revision they freed the key at.
			spy, _ := scaleConn(b, url)
			var knocks, words atomic.Int64
			if _, err := spy.Subscribe("natsputex.knock.>", func(m *nats.Msg) {
				if len(m.Data) == 0 {
					knocks.Add(1)
				} else {
					words.Add(1)
				}
			}); err != nil {
				b.Fatal(err)
			}
			if err := spy.Flush(); err != nil {
				b.Fatal(err)
			}
			out0, in0 := stats()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for _, l := range lockers {
				wg.Go(func() {
					for left.Add(-1) >= 0 {
						lease, err := l.Lock(ctx, "job")
						if err != nil {
							b.Error(err)
							return
						}
						for t0 := time.Now(); time.Since(t0) < 100*time.Microsecond; {
						}
						if err := lease.Release(ctx); err != nil {
							b.Error(err)
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			out1, in1 := stats()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "grants/s")
			b.ReportMetric(float64(out1-out0)/float64(b.N), "pub/grant")
			b.ReportMetric(float64(in1-in0)/float64(b.N), "recv/grant")
			b.ReportMetric(float64(knocks.Load())/float64(b.N), "knocks/grant")
			b.ReportMetric(float64(words.Load())/float64(b.N), "words/grant")
		})
	}
}
