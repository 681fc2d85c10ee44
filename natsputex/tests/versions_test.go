package natsputex_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

// This file tests natsputex on the NATS versions and topologies it
// supports, and its refusal of those it does not: the local nats-server
// program (2.9 on the reference machine) as a single node and as a
// 3-node cluster, beside the embedded server's single node and cluster.

// workload is the figures of a contention run: every grant checked by
// the grants of its name (no other lease on the name live, the token above
// every earlier one).
type workload struct {
	byName     map[string]*grants
	grants     int
	overlaps   int    // grants made while another lease on the name was live
	outOfOrder int    // grants with a token not above the name's last
	first      string // the first violation, described
}

// sum gathers the figures of every name's grants.
func (w *workload) sum() {
	for _, name := range slices.Sorted(maps.Keys(w.byName)) {
		g := w.byName[name]
		g.mu.Lock()
		w.grants += len(g.leases)
		w.overlaps += g.overlaps
		w.outOfOrder += g.outOfOrder
		if w.first == "" && len(g.bad) > 0 {
			w.first = g.bad[0]
		}
		g.mu.Unlock()
	}
}

func (w *workload) String() string {
	s := fmt.Sprintf("%d grants, %d overlapping a live lease, %d with a token out of order", w.grants, w.overlaps, w.outOfOrder)
	if w.first != "" {
		s += "; first: " + w.first
	}
	return s
}

// contendFor runs procs clients (as many connections, like processes) with
// goroutines each, locking names at random with Lock for d, holding each
// lease a few milliseconds, and returns the figures.
func contendFor(t *testing.T, urls, bucket string, d time.Duration, procs, goroutines int, names []string, opts ...natsputex.Option) *workload {
	t.Helper()
	w := &workload{byName: map[string]*grants{}}
	for _, n := range names {
		w.byName[n] = newGrants()
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var errs []error
	for range procs {
		l := newTestClient(t, urls, bucket, opts...).Locker()
		for range goroutines {
			wg.Go(func() {
				for ctx.Err() == nil {
					name := names[rand.IntN(len(names))]
					lease, err := l.Lock(ctx, name)
					if err != nil {
						if ctx.Err() == nil {
							errMu.Lock()
							errs = append(errs, err)
							errMu.Unlock()
							time.Sleep(10 * time.Millisecond)
						}
						continue
					}
					w.byName[name].grant(name, lease)
					time.Sleep(time.Duration(rand.IntN(10)) * time.Millisecond)
					rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
					_ = lease.Release(rctx)
					rcancel()
				}
			})
		}
	}
	wg.Wait()
	w.sum()
	if len(errs) > 0 {
		t.Logf("%d Lock calls failed (the workload goes on), first: %v", len(errs), errs[0])
	}
	return w
}

// TestClusterContention runs the contention workload of nats-server issue
// #4320's symptom (4 processes × 2 goroutines locking 3 names) on an
// embedded 3-node cluster with an R3 bucket: no lease is granted while
// another on its name is live, and tokens rise with every grant.
func TestClusterContention(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster and 10 s of contention")
	}
	c := natsenv.StartCluster(t, 3)
	t.Logf("embedded nats-server %v", c.Versions())
	bucket := uniqueBucket("contend")
	prepareBucket(t, c.URLs(), bucket, natsputex.WithReplicas(3))
	w := contendFor(t, c.URLs(), bucket, 10*time.Second, 4, 2, []string{"a", "b", "c"})
	t.Log(w)
	if w.grants == 0 {
		t.Fatal("no lock was granted")
	}
	if w.overlaps > 0 || w.outOfOrder > 0 {
		t.Fatalf("mutual exclusion broken: %v", w)
	}
}

// TestBinaryClusterContention runs the same workload on a 3-node cluster of
// the local nats-server program. On a version with nats-server issue #4320
// (before 2.9.21), New refuses the R3 bucket unless told to allow it, and
// the workload, run with that option, shows what it costs: the figures are
// reported, not checked, as such a cluster is unsupported. On a fixed
// version they are checked as on the embedded cluster.
func TestBinaryClusterContention(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster and 15 s of contention")
	}
	c := natsenv.StartBinaryCluster(t, 3)
	version := c.Versions()[0]
	t.Logf("nats-server %v from %s", c.Versions(), c.Servers()[0].Binary())
	bucket := uniqueBucket("contend29")
	var opts []natsputex.Option
	unsafe := natsputex.UnsafeServerVersion(version)
	if unsafe {
		opts = append(opts, natsputex.WithUnsafeServer(func(err error) { t.Logf("warning: %v", err) }))
	}
	prepareBucket(t, c.URLs(), bucket, append(opts, natsputex.WithReplicas(3))...)
	w := contendFor(t, c.URLs(), bucket, 15*time.Second, 4, 2, []string{"a", "b", "c"}, opts...)
	t.Logf("nats-server %s, R3: %v", version, w)
	if w.grants == 0 {
		t.Fatal("no lock was granted")
	}
	if unsafe {
		t.Logf("nats-server %s is below %s (nats-server issue #4320): unsupported, the figures above are not checked", version, natsputex.MinClusterVersion)
		return
	}
	if w.overlaps > 0 || w.outOfOrder > 0 {
		t.Fatalf("mutual exclusion broken: %v", w)
	}
}

// TestNewRefusesUnsafeCluster: on a 3-node cluster of a nats-server with
// issue #4320 (the local 2.9.10), New refuses an R3 bucket with an error
// naming the version and the issue, whether it would create the bucket or
// finds it; WithUnsafeServer lets it through with a warning; an R1 bucket
// on the same cluster, whose writes are checked where they are stored, is
// accepted.
func TestNewRefusesUnsafeCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start")
	}
	c := natsenv.StartBinaryCluster(t, 3)
	version := c.Versions()[0]
	if !natsputex.UnsafeServerVersion(version) {
		t.Skipf("nats-server %s has issue #4320 fixed: nothing to refuse", version)
	}
	nc, js, err := connect(c.URLs())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	refused := func(bucket string, opts ...natsputex.Option) {
		t.Helper()
		cl, err := natsputex.New(ctx, js, bucket, opts...)
		if err == nil {
			_ = cl.Close(context.Background())
			t.Fatalf("New on an R3 bucket of nats-server %s succeeded; want a refusal naming issue #4320", version)
		}
		if !errors.Is(err, natsputex.ErrUnsafeServer) {
			t.Fatalf("New: %v; want an error matching ErrUnsafeServer", err)
		}
		for _, want := range []string{version, "#4320", natsputex.MinClusterVersion} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("New's error %q does not say %q", err, want)
			}
		}
		t.Logf("refused: %v", err)
	}
	// A bucket New would create, then one that exists.
	fresh := uniqueBucket("refuse")
	refused(fresh, natsputex.WithReplicas(3))
	if _, err := js.KeyValue(ctx, fresh); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("after the refusal, looking up the bucket gives %v; want ErrBucketNotFound (nothing created)", err)
	}
	existing := uniqueBucket("refuse")
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: existing, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	refused(existing)

	var warned []error
	cl, err := natsputex.New(ctx, js, existing, natsputex.WithUnsafeServer(func(err error) { warned = append(warned, err) }))
	if err != nil {
		t.Fatalf("New with WithUnsafeServer: %v", err)
	}
	_ = cl.Close(context.Background())
	if len(warned) != 1 || !errors.Is(warned[0], natsputex.ErrUnsafeServer) {
		t.Errorf("WithUnsafeServer's warning: %v; want one error matching ErrUnsafeServer", warned)
	}

	cl, err = natsputex.New(ctx, js, uniqueBucket("r1"))
	if err != nil {
		t.Fatalf("New on an R1 bucket of the same cluster: %v", err)
	}
	_ = cl.Close(context.Background())
}

// TestConformanceBinary runs the suite on a single node of the local
// nats-server program (2.9 on the reference machine), started for the
// test: the oldest server natsputex supports.
func TestConformanceBinary(t *testing.T) {
	s := natsenv.StartBinaryServer(t)
	t.Logf("nats-server %s from %s", s.Version(), s.Binary())
	bucket := uniqueBucket("confbin")
	prepareBucket(t, s.URL(), bucket)
	contracttest.RunConformanceTests(t, newHarnessFunc(s.URL(), bucket))
}

// TestConformanceBinaryCluster runs the suite on a 3-node cluster of the
// local nats-server program with an R3 bucket, when its version is one
// natsputex supports there (2.9.21 or later: set LOCKS_NATS_SERVER to
// such a program). Below 2.9.21 it is skipped: New refuses such a
// cluster (TestNewRefusesUnsafeCluster), and with WithUnsafeServer the
// suite fails there (MutualExclusion, Fencing, SemaphoreExclusion and
// PausedHolder with 2.9.10), as TestBinaryClusterContention measures.
func TestConformanceBinaryCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start")
	}
	bin := natsenv.Binary(t)
	version, err := natsenv.BinaryVersion(bin)
	if err != nil {
		t.Fatal(err)
	}
	if natsputex.UnsafeServerVersion(version) {
		t.Skipf("nats-server %s (%s) is below %s (nats-server issue #4320): a cluster of it is unsupported", version, bin, natsputex.MinClusterVersion)
	}
	c := natsenv.StartBinaryCluster(t, 3)
	t.Logf("nats-server %v from %s", c.Versions(), bin)
	bucket := uniqueBucket("confbin3")
	prepareBucket(t, c.URLs(), bucket, natsputex.WithReplicas(3))
	contracttest.RunConformanceTests(t, newHarnessFunc(c.URLs(), bucket))
}

func TestUnsafeServerVersion(t *testing.T) {
	for v, unsafe := range map[string]bool{
		"2.9.10": true, "v2.9.20": true, "2.9.21": false, "2.9.25": false,
		"2.10.0": false, "2.10.0-RC.1": false, "v2.11.17": false, "3.0.0": false,
		"2.8.4": true, "1.99.99": true, "": true, "junk": true, "2.9": true,
	} {
		if got := natsputex.UnsafeServerVersion(v); got != unsafe {
			t.Errorf("UnsafeServerVersion(%q) = %v, want %v", v, got, unsafe)
		}
	}
}
