package redlockprio_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
	"github.com/latchkey-go/latchkey/redlockprio/internal/scripts"
)

// The tests' fixture, in four parts: masters and clients (mustClient and
// its options), the keys at the masters, hooks on a client's calls, and
// helpers around critical sections (recorded in a
// contracttest.WriteHistory) and leases.

const (
	testTTL   = 600 * time.Millisecond
	testRenew = 190 * time.Millisecond // at most (TTL − drift)/3
)

// newRedis returns a go-redis client for one master, as the tests use
// them: calls bounded by their contexts, no retries (a test that kills a
// master wants to see it fail at once).
func newRedis(addr string) *redis.Client {
	return redis.NewClient(clientOptions(addr).Simple())
}

// clientOptions are the options of the tests' clients of the master (or
// one-node cluster) at addr.
func clientOptions(addr string) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                 []string{addr},
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialTimeout:           time.Second,
		ReadTimeout:           2 * time.Second,
		WriteTimeout:          2 * time.Second,
		PoolSize:              32,
	}
}

// client is a test client of the masters: a redlockprio.Client, its
// Locker, and the go-redis clients it was made on (closed with it).
type client struct {
	rcs     []*redis.Client
	c       *redlockprio.Client
	l       *redlockprio.Locker // c's
	proxies testenv.Proxies     // its links, with viaProxies
	closed  sync.Once
}

func (c *client) Locker() locks.Locker { return c.l }

func (c *client) Semaphore(_ context.Context, size int) (locks.Semaphore, error) {
	return c.c.Semaphore(size)
}

func (c *client) Close(ctx context.Context) error {
	var err error
	c.closed.Do(func() {
		err = c.c.Close(ctx)
		for _, rc := range c.rcs {
			_ = rc.Close() // already closed after a Kill
		}
	})
	return err
}

// cut cuts the client off from every master (its proxies refuse and drop
// its connections), as a partition or a hung process would, while the
// masters stay up.
func (c *client) cut() { c.proxies.Cut() }

// newClient makes a client on the masters at addrs, with the tests' TTL
// and renewal interval unless opts change them.
func newClient(addrs []string, opts ...redlockprio.Option) (*client, error) {
	var rcs []*redis.Client
	for _, a := range addrs {
		rcs = append(rcs, newRedis(a))
	}
	return newClientOn(rcs, append(testTiming(), opts...)...)
}

// testTiming is the tests' TTL and renewal interval, which a client has
// unless its options change them.
func testTiming() []redlockprio.Option {
	return []redlockprio.Option{redlockprio.WithTTL(testTTL), redlockprio.WithRenewInterval(testRenew)}
}

// newClientOn makes a client on the go-redis clients rcs, which it
// closes with itself (or at once when New fails).
func newClientOn(rcs []*redis.Client, opts ...redlockprio.Option) (*client, error) {
	c := &client{rcs: rcs}
	var ms []redis.UniversalClient
	for _, rc := range rcs {
		ms = append(ms, rc)
	}
	rc, err := redlockprio.New(ms, opts...)
	if err != nil {
		for _, rc := range rcs {
			_ = rc.Close()
		}
		return nil, err
	}
	c.c, c.l = rc, rc.Locker()
	return c, nil
}

// A clientOption sets up a client made by mustClient: its Locker's
// options, and how its go-redis clients reach the masters.
type clientOption func(*clientSetup)

type clientSetup struct {
	options         []redlockprio.Option // after testTiming
	packageDefaults bool                 // no testTiming
	proxied         bool
	retrying        bool
	dialOnce        bool
	timeouts        *atomic.Int64 // counts calls that timed out
}

// countingTimeouts counts, in n, the client's calls to a master that
// ended with a timeout (its context's deadline, or the socket's).
func countingTimeouts(n *atomic.Int64) clientOption {
	return func(s *clientSetup) { s.timeouts = n }
}

// timeoutCounter is the go-redis hook of countingTimeouts.
type timeoutCounter struct{ n *atomic.Int64 }

func (h timeoutCounter) count(err error) error {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		h.n.Add(1)
	}
	return err
}

func (h timeoutCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h timeoutCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { return h.count(next(ctx, cmd)) }
}

func (h timeoutCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { return h.count(next(ctx, cmds)) }
}

// with adds redlockprio options, applied in order after the tests' TTL
// and renewal interval.
func with(opts ...redlockprio.Option) clientOption {
	return func(s *clientSetup) { s.options = append(s.options, opts...) }
}

// withPriority sets the Locker's priority.
func withPriority(p int) clientOption { return with(redlockprio.WithPriority(p)) }

// withTiming sets the TTL and the drift factor, and the longest renewal
// interval New accepts for them, (TTL − drift)/3.
func withTiming(ttl time.Duration, driftFactor float64) clientOption {
	drift := time.Duration(float64(ttl)*driftFactor) + 2*time.Millisecond
	return with(redlockprio.WithTTL(ttl), redlockprio.WithDriftFactor(driftFactor),
		redlockprio.WithRenewInterval((ttl-drift)/3))
}

// packageDefaults leaves the TTL and renewal interval to the package's
// defaults (and the options), instead of the tests' testTiming.
func packageDefaults() clientOption { return func(s *clientSetup) { s.packageDefaults = true } }

// viaProxies links the client to each master through a fault proxy of
// its own (client.proxies), which a test can cut, black-hole, slow down or
// make drop replies while the masters stay up. The proxies are restored
// before the client closes, so that Close can release.
func viaProxies() clientOption { return func(s *clientSetup) { s.proxied = true } }

// retrying gives the client's go-redis clients go-redis's default retries
// (3), instead of the tests' MaxRetries -1.
func retrying() clientOption { return func(s *clientSetup) { s.retrying = true } }

// dialOnce makes the client's go-redis clients fail a refused dial at
// once (no dial retries), so that a refusing master answers first.
func dialOnce() clientOption { return func(s *clientSetup) { s.dialOnce = true } }

// mustClient makes a client on the masters at addrs, closed at the end of
// the test.
func mustClient(t testing.TB, addrs []string, opts ...clientOption) *client {
	t.Helper()
	var s clientSetup
	for _, o := range opts {
		o(&s)
	}
	var (
		proxies testenv.Proxies
		rcs     []*redis.Client
	)
	for _, addr := range addrs {
		if s.proxied {
			px := testenv.NewProxy(t, addr)
			proxies = append(proxies, px)
			addr = px.Addr()
		}
		o := clientOptions(addr).Simple()
		if s.retrying {
			o.MaxRetries = 0 // go-redis's default: 3 retries
		}
		if s.dialOnce {
			o.DialerRetries = 1
		}
		rc := redis.NewClient(o)
		if s.timeouts != nil {
			rc.AddHook(timeoutCounter{s.timeouts})
		}
		rcs = append(rcs, rc)
	}
	if !s.packageDefaults {
		s.options = append(testTiming(), s.options...)
	}
	c, err := newClientOn(rcs, s.options...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c.proxies = proxies
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	t.Cleanup(proxies.Restore)
	return c
}

// warm subscribes a Locker's inbox and dials its connections while every
// master is reachable. A first TryLock whose dials and scripts a loaded
// machine answers after the call timeout (under 200ms for TTLs under 2s)
// fails with a *QuorumError and holds nothing: warm tries again, on a
// fresh name, for up to 5s.
func warm(t testing.TB, l *redlockprio.Locker) {
	t.Helper()
	ctx := ctxFor(t, 5*time.Second)
	for {
		lease, err := l.TryLock(ctx, uniqueName(t))
		var qe *redlockprio.QuorumError
		if errors.As(err, &qe) && ctx.Err() == nil {
			t.Logf("warming up: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		_ = lease.Release(context.Background())
		return
	}
}

// waitUntil polls cond every 2ms until it reports nothing missing (""),
// and fails t after d with what (the state waited for) and what cond last
// reported missing.
func waitUntil(t testing.TB, d time.Duration, what string, cond func() (missing string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		missing := cond()
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %v: %s", what, d, missing)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var nameSeq atomic.Int64

// uniqueName returns a name no other test uses.
func uniqueName(t testing.TB) string {
	return fmt.Sprintf("%s-%d-%d", t.Name(), time.Now().UnixNano()%1e6, nameSeq.Add(1))
}

// addrsOf returns the servers' addresses.
func addrsOf(servers []*testenv.RedisServer) []string {
	var addrs []string
	for _, s := range servers {
		addrs = append(addrs, s.Addr())
	}
	return addrs
}

// ctxFor returns a context that ends after d or with the test.
func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// deadAddr returns an address where nothing listens.
func deadAddr(t testing.TB) string {
	return fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
}

// testDrift is the drift allowance of the tests' Lockers (testTTL, the
// default drift factor).
const testDrift = testTTL/100 + 2*time.Millisecond

// theftMargin is the scheduling margin of the bounds on a thief's wait,
// beside the slack a bound measures: generous, not a performance claim.
const theftMargin = 200 * time.Millisecond

// The keys at the masters, read and written behind the Lockers' backs.

func keyExists(t testing.TB, addr, key string) bool {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	n, err := rc.Exists(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("EXISTS %s on %s: %v", key, addr, err)
	}
	return n == 1
}

// holderOf returns the lease id holding name's key (slot 1) on the master
// at addr, or "".
func holderOf(t testing.TB, addr, name string) string {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	id, _ := rc.HGet(context.Background(), "latchkey:{"+name+"}:1", "id").Result()
	return id
}

// holderOfSlot returns the lease id holding name's slot key on the master
// at addr, or "".
func holderOfSlot(t testing.TB, addr, name string, slot int) string {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	id, _ := rc.HGet(context.Background(), "latchkey:{"+name+"}:"+strconv.Itoa(slot), "id").Result()
	return id
}

// waitForHolder waits until the name's key (slot 1) is held on every
// master by a lease of the Locker with id lockerID.
func waitForHolder(t testing.TB, addrs []string, name, lockerID string) {
	t.Helper()
	waitForHolderOn(t, addrs, name, lockerID, len(addrs))
}

// waitForHolderOn waits until the name's key (slot 1) is held on at least
// need masters by a lease of the Locker with id lockerID, and returns
// their indices in addrs. It fails t after 5s, naming every holder.
func waitForHolderOn(t testing.TB, addrs []string, name, lockerID string, need int) []int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		held := heldBy(t, addrs, name, lockerID)
		if len(held) >= need {
			return held
		}
		if time.Now().After(deadline) {
			var holders []string
			for _, a := range addrs {
				holders = append(holders, fmt.Sprintf("%q", holderOf(t, a, name)))
			}
			t.Fatalf("the Locker %s does not hold %q on %d of %d masters after 5s: holders %s", lockerID, name, need, len(addrs), strings.Join(holders, ", "))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// heldBy returns the indices of the masters where the name's key (slot 1)
// is held by a lease of the Locker with id lockerID.
func heldBy(t testing.TB, addrs []string, name, lockerID string) []int {
	var held []int
	for i, a := range addrs {
		if strings.HasPrefix(holderOf(t, a, name), lockerID+":") {
			held = append(held, i)
		}
	}
	return held
}

// heldOn returns on how many masters the name's key (slot 1) is held by a
// lease of the Locker with id lockerID, once that is all of them or after
// wait.
func heldOn(t testing.TB, addrs []string, name, lockerID string, wait time.Duration) int {
	t.Helper()
	for deadline := time.Now().Add(wait); ; time.Sleep(5 * time.Millisecond) {
		if n := len(heldBy(t, addrs, name, lockerID)); n == len(addrs) || time.Now().After(deadline) {
			return n
		}
	}
}

// plant sets a slot key on one master as a holder of another process
// would, for ten seconds.
func plant(t testing.TB, addr, name string, slot int, id string, prio int) {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	key := "latchkey:{" + name + "}:" + strconv.Itoa(slot)
	ctx := context.Background()
	if err := rc.HSet(ctx, key, "id", id, "p", prio, "ch", "nobody").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.PExpire(ctx, key, 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
}

// plantFor is plant with a chosen expiry.
func plantFor(t testing.TB, addr, name string, slot int, id string, prio int, ttl time.Duration) {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	key := "latchkey:{" + name + "}:" + strconv.Itoa(slot)
	ctx := context.Background()
	if err := rc.HSet(ctx, key, "id", id, "p", prio, "ch", "nobody").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.PExpire(ctx, key, ttl).Err(); err != nil {
		t.Fatal(err)
	}
}

// unplant deletes a slot key planted on one master.
func unplant(t testing.TB, addr, name string, slot int) {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	if err := rc.Del(context.Background(), "latchkey:{"+name+"}:"+strconv.Itoa(slot)).Err(); err != nil {
		t.Fatal(err)
	}
}

// maxPTTL returns the largest remaining TTL of name's key (slot 1) on the
// masters at addrs.
func maxPTTL(t testing.TB, addrs []string, name string) time.Duration {
	t.Helper()
	var largest time.Duration
	for _, a := range addrs {
		rc := newRedis(a)
		d, err := rc.PTTL(context.Background(), "latchkey:{"+name+"}:1").Result()
		_ = rc.Close()
		if err != nil {
			t.Fatalf("PTTL on %s: %v", a, err)
		}
		largest = max(largest, d)
	}
	return largest
}

// slotKeys returns the name's slot keys (1..n) present on the master at addr.
func slotKeys(t testing.TB, addr, name string, n int) []string {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	var got []string
	for s := 1; s <= n; s++ {
		k := "latchkey:{" + name + "}:" + strconv.Itoa(s)
		id, _ := rc.HGet(context.Background(), k, "id").Result()
		if id != "" {
			got = append(got, k+"="+id)
		}
	}
	return got
}

// namesOn returns the names whose lock key exists on the master at addr.
func namesOn(t testing.TB, addr string, names []string) []string {
	t.Helper()
	var out []string
	for _, n := range names {
		if keyExists(t, addr, "latchkey:{"+n+"}:1") {
			out = append(out, n)
		}
	}
	return out
}

// fenceKey is the key of name's fence counter.
func fenceKey(name string) string { return "latchkey:{" + name + "}:fence" }

// fenceOf returns the name's fence counter on the master at addr (0 when
// there is none).
func fenceOf(t testing.TB, addr, name string) uint64 {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	n, err := rc.Get(context.Background(), fenceKey(name)).Uint64()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("GET %s on %s: %v", fenceKey(name), addr, err)
	}
	return n
}

// setFence sets name's fence counter on the master at addr to n.
func setFence(t testing.TB, addr, name string, n uint64) {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	if err := rc.Set(context.Background(), fenceKey(name), n, 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// bumpFence raises name's fence counter on the master at addr by d; errors
// (a master restarting) are ignored.
func bumpFence(addr, name string, d int64) {
	rc := newRedis(addr)
	defer rc.Close()
	_ = rc.IncrBy(context.Background(), "latchkey:{"+name+"}:fence", d).Err()
}

// Hooks on a go-redis client's calls.

// scriptNames names redlockprio's Lua scripts by their SHA1, for the
// tests that record what a Client sends to its masters.
var scriptNames = func() map[string]string {
	m := map[string]string{}
	for name, src := range map[string]string{
		"acquire": scripts.Acquire, "release": scripts.Release, "renew": scripts.Renew, "raise": scripts.Raise,
	} {
		sum := sha1.Sum([]byte(src))
		m[hex.EncodeToString(sum[:])] = name
	}
	return m
}()

// scriptOf names the package's script that cmd runs (EVALSHA or EVAL),
// or "".
func scriptOf(cmd redis.Cmder) string {
	args := cmd.Args()
	if len(args) < 2 {
		return ""
	}
	s, _ := args[1].(string)
	switch strings.ToLower(cmd.Name()) {
	case "evalsha":
		return scriptNames[s]
	case "eval":
		d := sha1.Sum([]byte(s))
		return scriptNames[hex.EncodeToString(d[:])]
	}
	return ""
}

func runsScript(name string) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool { return scriptOf(cmd) == name }
}

// isTheftNotice matches the PUBLISH of a theft notice ("N|victim|...").
func isTheftNotice(cmd redis.Cmder) bool {
	args := cmd.Args()
	if !strings.EqualFold(cmd.Name(), "publish") || len(args) < 3 {
		return false
	}
	p, _ := args[2].(string)
	return strings.HasPrefix(p, "N|")
}

// cmdGate holds, on one go-redis client, the commands it matches while
// it is armed, until it is opened (or the call's context ends), and
// says on seen when the first one comes.
type cmdGate struct {
	match    func(redis.Cmder) bool
	armed    atomic.Bool
	seenOnce sync.Once
	seen     chan struct{}
	openOnce sync.Once
	opened   chan struct{}
}

func newCmdGate(match func(redis.Cmder) bool) *cmdGate {
	return &cmdGate{match: match, seen: make(chan struct{}), opened: make(chan struct{})}
}

func (g *cmdGate) open() { g.openOnce.Do(func() { close(g.opened) }) }

func (g *cmdGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *cmdGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if g.armed.Load() && g.match(cmd) {
			g.seenOnce.Do(func() { close(g.seen) })
			select {
			case <-g.opened:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
}

func (g *cmdGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func waitSeen(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// releaseDelay delays, on one go-redis client, every call of the release
// script, and says on seen when the first one comes.
type releaseDelay struct {
	delay time.Duration
	once  sync.Once
	seen  chan struct{}
}

func (h *releaseDelay) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *releaseDelay) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); strings.EqualFold(cmd.Name(), "evalsha") && len(args) > 1 &&
			scriptNames[args[1].(string)] == "release" {
			h.once.Do(func() { close(h.seen) })
			select {
			case <-time.After(h.delay):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
}

func (h *releaseDelay) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Critical sections and leases.

// ms formats d in milliseconds.
func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }

// lockAsync runs Lock in the background; what it returns comes on the channel.
// A lease it gets is released at once (a waiting thief is not supposed to
// get the name in these tests before the test ends it).
// A grant is recorded in hist as a section of one write.
func lockAsync(ctx context.Context, hist *contracttest.WriteHistory, who string, l *redlockprio.Locker, name string) <-chan error {
	done := make(chan error, 1)
	go func() {
		lease, err := l.Lock(ctx, name)
		if err == nil {
			s := hist.Begin(who, lease)
			s.Write(hist.Now())
			s.LetGo()
			_ = lease.Release(context.Background())
			err = errors.New("got the name")
		}
		done <- err
	}()
	return done
}

// leaseWatch records, for a lease, when its context ended and the
// validity deadline it had then.
type leaseWatch struct {
	mu       sync.Mutex
	ended    time.Time
	deadline time.Time
	cause    error
}

func watchLease(l locks.Lease) *leaseWatch {
	w := &leaseWatch{}
	go func() {
		<-l.Context().Done()
		now := time.Now()
		w.mu.Lock()
		w.ended, w.deadline, w.cause = now, l.(*redlockprio.Lease).Deadline(), context.Cause(l.Context())
		w.mu.Unlock()
	}()
	return w
}

func (w *leaseWatch) get() (ended, deadline time.Time, cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ended, w.deadline, w.cause
}

// fencedResource is a resource that refuses writes whose fencing token is
// not above the largest it has accepted, as the package doc asks of the
// resources a lease protects.
type fencedResource struct {
	mu  sync.Mutex
	max uint64
	log []string
}

func (r *fencedResource) write(token uint64, what string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if token <= r.max {
		return fmt.Errorf("stale token %d (accepted %d already)", token, r.max)
	}
	r.max = token
	r.log = append(r.log, what)
	return nil
}

// shortErr describes err in a few words for a tally of errors.
func shortErr(err error) string {
	var qe *redlockprio.QuorumError
	if errors.As(err, &qe) {
		return fmt.Sprintf("quorum %d/%d", qe.Got, qe.Need)
	}
	return err.Error()
}

// cycleTime measures the longest of a few uncontended Lock + Release
// cycles on a fresh name: the slack of a step on this machine now. A
// cycle whose Lock fails with a QuorumError (its calls ran out their
// call timeout on a machine starved of CPU: the documented limit) is
// made again, up to five times.
func cycleTime(t *testing.T, l *redlockprio.Locker) time.Duration {
	t.Helper()
	var longest time.Duration
	starved := 0
	for done := 0; done < 5; {
		start := time.Now()
		lease, err := l.Lock(ctxFor(t, 5*time.Second), uniqueName(t))
		var qe *redlockprio.QuorumError
		if errors.As(err, &qe) && starved < 5 {
			starved++
			t.Logf("measuring a cycle: %v (made again)", err)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		done++
		_ = lease.Release(context.Background())
		longest = max(longest, time.Since(start))
	}
	return longest
}

// checkNoLeaks waits up to 5s for the goroutines not in ignore (nor in
// more) to end and fails t with those left. The Client's background work after a Close
// whose context ended is bounded by call timeouts and publish timeouts
// (at most max(TTL/2, 1s)), so 5s is generous.
func checkNoLeaks(t *testing.T, ignore goleak.Option, more ...goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	opts := append([]goleak.Option{ignore,
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
		// a master restarted by the test: testenv's process goroutines
		goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest/testenv.(*redisProc).start.func1"),
		goleak.IgnoreAnyFunction("os/exec.(*Cmd).Start.func2"),
		// a WatchedBound's scheduler watcher, which ends at the test's cleanup
		goleak.IgnoreAnyFunction("github.com/latchkey-go/latchkey/contracttest.watchStalls.func1")}, more...)
	for {
		err := goleak.Find(opts...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("goroutines outlive Close by 5s: %v", err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
