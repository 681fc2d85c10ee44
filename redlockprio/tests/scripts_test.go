package redlockprio_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/redlockprio"
)

// callLog records, on one go-redis client, each call the client makes,
// as one line: a command as its name and script ("evalsha acquire",
// "eval release", "script load renew"), followed by ": NOSCRIPT" or ": "
// and the error when it failed; a pipeline as its commands in brackets
// ("[evalsha renew, evalsha renew]"). It leaves out the commands a client
// sends on its own to set up a connection (HELLO, CLIENT SETINFO...).
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (h *callLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *callLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// The client sets err on cmd only after the hooks have returned.
		err := next(ctx, cmd)
		if s := describe(cmd, err); s != "" {
			h.add(s)
		}
		return err
	}
}

func (h *callLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		var ss []string
		for _, c := range cmds {
			if s := describe(c, c.Err()); s != "" {
				ss = append(ss, s)
			}
		}
		if len(ss) > 0 {
			h.add("[" + strings.Join(ss, ", ") + "]")
		}
		return err
	}
}

func (h *callLog) add(s string) {
	h.mu.Lock()
	h.calls = append(h.calls, s)
	h.mu.Unlock()
}

// take returns the calls recorded so far and forgets them.
func (h *callLog) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	calls := h.calls
	h.calls = nil
	return calls
}

func (h *callLog) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.calls)
}

// describe returns cmd, which ended with err, as a callLog shows it, or
// "" for a command the client sent to set up a connection.
func describe(cmd redis.Cmder, err error) string {
	arg := func(i int) string {
		if args := cmd.Args(); i < len(args) {
			return fmt.Sprint(args[i])
		}
		return ""
	}
	script := func(sha string) string {
		if name, ok := scriptNames[sha]; ok {
			return name
		}
		return fmt.Sprintf("%.8s", sha)
	}
	source := func(src string) string {
		d := sha1.Sum([]byte(src))
		return script(hex.EncodeToString(d[:]))
	}
	s := strings.ToLower(cmd.Name())
	switch s {
	case "hello", "client", "auth", "select", "readonly", "ping":
		return ""
	case "evalsha":
		s += " " + script(arg(1))
	case "eval":
		s += " " + source(arg(1))
	case "script":
		s += " " + strings.ToLower(arg(1))
		if strings.EqualFold(arg(1), "load") {
			s += " " + source(arg(2))
		}
	}
	switch {
	case err == nil:
	case redis.HasErrorPrefix(err, "NOSCRIPT"):
		s += ": NOSCRIPT"
	default:
		s += ": " + err.Error()
	}
	return s
}

// logged makes a Locker on addrs whose clients record their calls, one
// callLog per master.
func logged(t testing.TB, addrs []string, opts ...redlockprio.Option) (*client, []*callLog) {
	t.Helper()
	c := mustClient(t, addrs, with(opts...))
	logs := make([]*callLog, len(c.rcs))
	for i, rc := range c.rcs {
		logs[i] = &callLog{}
		rc.AddHook(logs[i])
	}
	return c, logs
}

// sends runs step and checks that it sent each master i the calls want[i]
// and no others. It first waits until the clients have made no call for
// 100ms (at most 3s), so that calls still running from earlier steps are
// not taken for this one's; then, as a step returns once a quorum has
// answered (the other calls finish in the background), until every
// master has made its calls (at most 3s), and 100ms longer, for calls
// the step should not have made.
func sends(t testing.TB, what string, logs []*callLog, want [][]string, step func()) {
	t.Helper()
	total := func() (n int) {
		for _, h := range logs {
			n += h.len()
		}
		return n
	}
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		n := total()
		time.Sleep(100 * time.Millisecond)
		if total() == n {
			break
		}
	}
	for _, h := range logs {
		h.take()
	}
	step()
	deadline := time.Now().Add(3 * time.Second)
	for i, h := range logs {
		for h.len() < len(want[i]) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	time.Sleep(100 * time.Millisecond)
	for i, h := range logs {
		if got := h.take(); !slices.Equal(got, want[i]) {
			t.Errorf("%s: master %d was sent %q, want %q", what, i, got, want[i])
		}
	}
}

func scriptFlush(t testing.TB, addr string) {
	t.Helper()
	rc := newRedis(addr)
	defer rc.Close()
	if err := rc.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestEachStepIsOneScript records what a Locker's go-redis clients send
// to each master. A Lock is one EVALSHA of the acquire script on each
// master, a Release one EVALSHA of the release script, and nothing else
// is sent; on a master that has lost its scripts (SCRIPT FLUSH), the
// EVALSHA is answered NOSCRIPT and followed by one EVAL of the same
// script, and the step still takes (or frees) the name there.
func TestEachStepIsOneScript(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	// Its renewals do not tick during the test (nor do its masters' other
	// calls mix with its steps'): TestRenewalIsOnePipelineOfScripts sees
	// to them.
	c, logs := logged(t, addrs, redlockprio.WithTTL(30*time.Second), redlockprio.WithRenewInterval(9*time.Second))
	ctx := ctxFor(t, 10*time.Second)
	// Warm up: load the scripts, subscribe the inbox, start the renewer
	// (held is held to the end, so that it does not start again).
	held, err := c.l.TryLock(ctx, uniqueName(t))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	if l, err := c.l.TryLock(ctx, uniqueName(t)); err != nil {
		t.Fatal(err)
	} else if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	for _, flushed := range []bool{false, true} {
		what := "with the scripts loaded"
		if flushed {
			what = "after SCRIPT FLUSH on master 0"
		}
		// want is what a step running script sends: one EVALSHA to each
		// master, but to a flushed one an EVALSHA answered NOSCRIPT and an
		// EVAL.
		want := func(script string) [][]string {
			w := make([][]string, len(addrs))
			for i := range w {
				w[i] = []string{"evalsha " + script}
			}
			if flushed {
				w[0] = []string{"evalsha " + script + ": NOSCRIPT", "eval " + script}
			}
			return w
		}

		name := uniqueName(t)
		var lease locks.Lease
		if flushed {
			scriptFlush(t, addrs[0])
		}
		sends(t, "Lock "+what, logs, want("acquire"), func() {
			if lease, err = c.l.Lock(ctx, name); err != nil {
				t.Fatalf("Lock %s: %v", what, err)
			}
		})
		id := lease.(*redlockprio.Lease).HolderID()
		for i, a := range addrs {
			if got := holderOf(t, a, name); got != id {
				t.Errorf("Lock %s: master %d holds %q for %q", what, i, got, id)
			}
		}

		if flushed {
			scriptFlush(t, addrs[0])
		}
		sends(t, "Release "+what, logs, want("release"), func() {
			if err := lease.Release(ctx); err != nil {
				t.Fatalf("Release %s: %v", what, err)
			}
		})
		for i, a := range addrs {
			if keyExists(t, a, "latchkey:{"+name+"}:1") {
				t.Errorf("Release %s: the key is still on master %d", what, i)
			}
		}
	}
}

// TestRenewalIsOnePipelineOfScripts records what a Locker holding two
// leases sends to each master while it only renews: once per tick, one
// pipeline of one EVALSHA of the renew script per lease, and nothing
// else. After SCRIPT FLUSH on master 0, the one tick that meets NOSCRIPT
// there loads the script (SCRIPT LOAD) and sends its pipeline again, even
// though the other masters have decided the round; the leases stay held
// and their keys on master 0 renewed.
func TestRenewalIsOnePipelineOfScripts(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	// The tests' renewal interval, but a TTL that a loaded machine's late
	// ticks cannot outlast: a lease of the tests' 600ms TTL ran out
	// without a renewal (1 of 20 runs at a load of 20).
	const ttl, renew = 3 * time.Second, testRenew
	c, logs := logged(t, addrs, redlockprio.WithTTL(ttl), redlockprio.WithRenewInterval(renew))
	ctx := ctxFor(t, 10*time.Second)
	var (
		names  []string
		leases []locks.Lease
	)
	for range 2 {
		name := uniqueName(t)
		l, err := c.l.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		names, leases = append(names, name), append(leases, l)
	}
	const tick = "[evalsha renew, evalsha renew]" // one per lease
	notTick := func(call string) bool { return call != tick }

	// Past the acquisitions' background calls and the renew script's
	// preload: wait for a first tick on every master.
	deadline := time.Now().Add(3 * time.Second)
	for i, h := range logs {
		var seen []string
		for !slices.Contains(seen, tick) {
			if time.Now().After(deadline) {
				t.Fatalf("master %d: no renewal tick %q within 3s; sent %q", i, tick, seen)
			}
			time.Sleep(10 * time.Millisecond)
			seen = append(seen, h.take()...)
		}
	}
	const rounds = 3
	sent := make([][]string, len(logs))
	renewalWindow(t, c.l, rounds, 10*time.Second, func() {
		for _, h := range logs {
			h.take()
		}
	}, func() {
		for i, h := range logs {
			sent[i] = h.take()
		}
	})
	for i, calls := range sent {
		if len(calls) < rounds-1 || len(calls) > rounds+1 || slices.ContainsFunc(calls, notTick) {
			t.Errorf("master %d: sent %q in %d renewal rounds, want %q once per round (± 1 at the window's ends)", i, calls, rounds, tick)
		}
	}

	scriptFlush(t, addrs[0])
	deadline = time.Now().Add(5 * time.Second)
	for logs[0].len() < 4 && time.Now().Before(deadline) { // the tick that reloads (3 calls), and one more
		time.Sleep(10 * time.Millisecond)
	}
	// Ticks, but for one that met NOSCRIPT (on some of its commands only,
	// if the flush came amid it), then the load, then that tick again.
	calls := logs[0].take()
	t.Logf("master 0 after SCRIPT FLUSH: %q", calls)
	j := slices.IndexFunc(calls, notTick)
	if !(j >= 0 && j+2 < len(calls) &&
		strings.Contains(calls[j], ": NOSCRIPT") && strings.ReplaceAll(calls[j], ": NOSCRIPT", "") == tick &&
		calls[j+1] == "script load renew" && !slices.ContainsFunc(calls[j+2:], notTick)) {
		t.Errorf("master 0 after SCRIPT FLUSH: sent %q, want %q but for one answered NOSCRIPT, followed by %q and %q",
			calls, tick, "script load renew", tick)
	}
	for i, h := range logs[1:] {
		if calls := h.take(); slices.ContainsFunc(calls, notTick) {
			t.Errorf("master %d, during the flush of master 0: sent %q, want only %q", i+1, calls, tick)
		}
	}
	// Renewed since the flush: a renewal that lands gives the key a whole
	// TTL again, while a key last renewed before the flush has less than
	// TTL − interval left by now (two ticks have come since). Polled: a
	// reading soon after a tick sees most of a TTL, whenever the loaded
	// machine lets the ticks come.
	for _, name := range names {
		var d time.Duration
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if d = maxPTTL(t, addrs[:1], name); d > ttl-renew {
				break
			}
		}
		if d <= ttl-renew {
			t.Errorf("master 0 after SCRIPT FLUSH: %q's PTTL never came back above %v within 5s (last %v)", name, ttl-renew, d)
		}
	}
	for _, l := range leases {
		if err := context.Cause(l.Context()); err != nil {
			t.Errorf("a lease ended: %v", err)
		}
	}
}
