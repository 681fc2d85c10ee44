package redlockprio_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net"
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

// sent is one command a go-redis client sent, as a scriptHook saw it.
type sent struct {
	name string // lower case, with SCRIPT's subcommand: "evalsha", "eval", "script load"
	sha  string // the script's SHA1: EVALSHA's argument, the digest of EVAL's or SCRIPT LOAD's source
	err  error
}

func (s sent) noscript() bool { return s.err != nil && redis.HasErrorPrefix(s.err, "NOSCRIPT") }

func (s sent) String() string {
	if s.err != nil {
		return fmt.Sprintf("%s %.8s (%v)", s.name, s.sha, s.err)
	}
	return fmt.Sprintf("%s %.8s", s.name, s.sha)
}

// roundTrip is one call on a client: a single command or a pipeline.
type roundTrip struct {
	pipeline bool
	cmds     []sent
}

func (r roundTrip) String() string {
	if r.pipeline {
		return fmt.Sprintf("pipeline%v", r.cmds)
	}
	return r.cmds[0].String()
}

// scriptHook records, on one go-redis client, every call the client
// makes and how each command ended, leaving out the commands a client
// sends on its own when it opens a connection (HELLO, CLIENT SETINFO...).
type scriptHook struct {
	mu  sync.Mutex
	log []roundTrip
}

func sentOf(cmd redis.Cmder, err error) sent {
	args := cmd.Args()
	s := sent{name: strings.ToLower(cmd.Name()), err: err}
	arg := func(i int) string {
		if i < len(args) {
			return fmt.Sprint(args[i])
		}
		return ""
	}
	digest := func(src string) string {
		d := sha1.Sum([]byte(src))
		return hex.EncodeToString(d[:])
	}
	switch s.name {
	case "evalsha":
		s.sha = arg(1)
	case "eval":
		s.sha = digest(arg(1))
	case "script":
		s.name += " " + strings.ToLower(arg(1))
		if s.name == "script load" {
			s.sha = digest(arg(2))
		}
	}
	return s
}

// setup says whether the client sent cmd on its own, to set up a
// connection.
func setup(s sent) bool {
	switch s.name {
	case "hello", "client", "auth", "select", "readonly", "ping":
		return true
	}
	return false
}

// add records a call. err is the error of a single command: a hook sees
// it as the result of next (the client sets it on the command only after
// the hooks have returned); a pipeline's commands have theirs already.
func (h *scriptHook) add(pipeline bool, cmds []redis.Cmder, err error) {
	r := roundTrip{pipeline: pipeline}
	for _, c := range cmds {
		if pipeline {
			err = c.Err()
		}
		if s := sentOf(c, err); !setup(s) {
			r.cmds = append(r.cmds, s)
		}
	}
	if len(r.cmds) == 0 {
		return
	}
	h.mu.Lock()
	h.log = append(h.log, r)
	h.mu.Unlock()
}

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.add(false, []redis.Cmder{cmd}, err)
		return err
	}
}

func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.add(true, cmds, nil)
		return err
	}
}

// take returns the calls recorded so far and forgets them.
func (h *scriptHook) take() []roundTrip {
	h.mu.Lock()
	defer h.mu.Unlock()
	log := h.log
	h.log = nil
	return log
}

func (h *scriptHook) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.log)
}

// hooked makes a Locker on addrs whose clients record their calls, one
// scriptHook per master.
func hooked(t testing.TB, addrs []string, opts ...redlockprio.Option) (*client, []*scriptHook) {
	t.Helper()
	c := mustClient(t, addrs, opts...)
	hooks := make([]*scriptHook, len(c.rcs))
	for i, rc := range c.rcs {
		hooks[i] = &scriptHook{}
		rc.AddHook(hooks[i])
	}
	return c, hooks
}

// quiet waits until the clients have made no call for 100ms (at most
// 3s), so that the calls still running in the background from earlier
// steps are not taken for the next one's.
func quiet(hooks []*scriptHook) {
	total := func() (n int) {
		for _, h := range hooks {
			n += h.len()
		}
		return n
	}
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		n := total()
		time.Sleep(100 * time.Millisecond)
		if total() == n {
			return
		}
	}
}

// stepCalls runs one step and returns each master's calls: it waits
// until every master i has made at least want[i] calls (a step returns
// once a quorum has answered; the other calls finish in the background),
// then a little longer, for calls it should not have made.
func stepCalls(t testing.TB, hooks []*scriptHook, want []int, step func()) [][]roundTrip {
	t.Helper()
	quiet(hooks)
	for _, h := range hooks {
		h.take()
	}
	step()
	deadline := time.Now().Add(3 * time.Second)
	for i, h := range hooks {
		for h.len() < want[i] && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	time.Sleep(100 * time.Millisecond)
	calls := make([][]roundTrip, len(hooks))
	for i, h := range hooks {
		calls[i] = h.take()
	}
	return calls
}

// oneScript checks that a master's calls for one step are one EVALSHA
// that succeeded or, when noscript, an EVALSHA that failed with NOSCRIPT
// and an EVAL of the same script that succeeded; it returns the script's
// SHA.
func oneScript(t testing.TB, what string, master int, calls []roundTrip, noscript bool) string {
	t.Helper()
	want := "one EVALSHA that succeeds"
	ok := len(calls) == 1 && !calls[0].pipeline && calls[0].cmds[0].name == "evalsha" && calls[0].cmds[0].err == nil
	if noscript {
		want = "an EVALSHA that fails with NOSCRIPT, then an EVAL of the same script that succeeds"
		ok = len(calls) == 2 && !calls[0].pipeline && !calls[1].pipeline &&
			calls[0].cmds[0].name == "evalsha" && calls[0].cmds[0].noscript() &&
			calls[1].cmds[0].name == "eval" && calls[1].cmds[0].err == nil &&
			calls[1].cmds[0].sha == calls[0].cmds[0].sha
	}
	if !ok {
		t.Errorf("%s, master %d: sent %v, want %s", what, master, calls, want)
		return ""
	}
	return calls[0].cmds[0].sha
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
// to each master. A Lock and a Release are one EVALSHA per master; on a
// master that has lost its scripts (SCRIPT FLUSH), an EVALSHA answered
// NOSCRIPT and then an EVAL of the same script, and the step still works.
func TestEachStepIsOneScript(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	// Its renewals do not tick during the test (nor do its masters' other
	// calls mix with its steps'): TestRenewalIsOnePipelineOfScripts sees
	// to them.
	c, hooks := hooked(t, addrs, redlockprio.WithTTL(30*time.Second), redlockprio.WithRenewInterval(9*time.Second))
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
		name := uniqueName(t)
		key := "latchkey:{" + name + "}:1"
		var lease locks.Lease
		want := []int{1, 1, 1} // calls per master
		if flushed {
			want[0] = 2
		}
		if flushed {
			scriptFlush(t, addrs[0])
		}
		calls := stepCalls(t, hooks, want, func() {
			if lease, err = c.l.Lock(ctx, name); err != nil {
				t.Fatalf("Lock %s: %v", what, err)
			}
		})
		id := lease.(*redlockprio.Lease).HolderID()
		var lockSHA string
		for i := range addrs {
			if sha := oneScript(t, "Lock "+what, i, calls[i], flushed && i == 0); sha != "" {
				if lockSHA != "" && sha != lockSHA {
					t.Errorf("Lock %s: master %d ran script %.8s, another %.8s", what, i, sha, lockSHA)
				}
				lockSHA = sha
			}
			if got := holderOf(t, addrs[i], name); got != id {
				t.Errorf("Lock %s: master %d holds %q for %q", what, i, got, id)
			}
		}

		if flushed {
			scriptFlush(t, addrs[0])
		}
		calls = stepCalls(t, hooks, want, func() {
			if err := lease.Release(ctx); err != nil {
				t.Fatalf("Release %s: %v", what, err)
			}
		})
		for i := range addrs {
			if sha := oneScript(t, "Release "+what, i, calls[i], flushed && i == 0); sha != "" && sha == lockSHA {
				t.Errorf("Release %s: master %d ran the acquire script", what, i)
			}
			if keyExists(t, addrs[i], key) {
				t.Errorf("Release %s: the key is still on master %d", what, i)
			}
		}
	}
}

// TestRenewalIsOnePipelineOfScripts records what a Locker holding two
// leases sends to each master while it only renews: one pipeline per
// master per tick, of one EVALSHA per lease. After SCRIPT FLUSH on a
// master, the tick that meets NOSCRIPT there loads the script (SCRIPT
// LOAD) and sends the pipeline again, once, and the leases stay held and
// their keys renewed.
func TestRenewalIsOnePipelineOfScripts(t *testing.T) {
	addrs := addrsOf(testenv.StartRedis(t, 3))
	c, hooks := hooked(t, addrs)
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
	okTick := func(r roundTrip) (string, bool) {
		if !r.pipeline || len(r.cmds) != len(names) {
			return "", false
		}
		for _, s := range r.cmds {
			if s.name != "evalsha" || s.err != nil || s.sha != r.cmds[0].sha {
				return "", false
			}
		}
		return r.cmds[0].sha, true
	}

	// Past the acquisitions' background calls and the renew script's
	// preload: wait for a first tick on every master.
	deadline := time.Now().Add(3 * time.Second)
	for i, h := range hooks {
		var seen []roundTrip
		for !slices.ContainsFunc(seen, func(r roundTrip) bool { _, ok := okTick(r); return ok }) {
			if time.Now().After(deadline) {
				t.Fatalf("master %d: no renewal tick (a pipeline of %d EVALSHA that succeed) within 3s; sent %v", i, len(names), seen)
			}
			time.Sleep(10 * time.Millisecond)
			seen = append(seen, h.take()...)
		}
	}
	for _, h := range hooks {
		h.take()
	}
	const ticks = 3
	time.Sleep(ticks*testRenew + testRenew/2)
	renewSHA := ""
	for i, h := range hooks {
		calls := h.take()
		if n := len(calls); n < ticks-1 || n > ticks+1 {
			t.Errorf("master %d: %d calls in %d renewal ticks, want one per tick: %v", i, n, ticks, calls)
		}
		for _, r := range calls {
			sha, ok := okTick(r)
			if !ok {
				t.Errorf("master %d: renewal tick sent %v, want a pipeline of %d EVALSHA (one per lease) that succeed", i, r, len(names))
				continue
			}
			if renewSHA == "" {
				renewSHA = sha
			} else if sha != renewSHA {
				t.Errorf("master %d: renewal ran script %.8s, elsewhere %.8s", i, sha, renewSHA)
			}
		}
	}

	// SCRIPT FLUSH on master 0: its next tick meets NOSCRIPT.
	scriptFlush(t, addrs[0])
	deadline = time.Now().Add(5 * time.Second)
	for hooks[0].len() < 4 && time.Now().Before(deadline) { // the tick that reloads (3 calls), and one more
		time.Sleep(10 * time.Millisecond)
	}
	calls := hooks[0].take()
	t.Logf("master 0 after SCRIPT FLUSH: %v", calls)
	reloads := 0
	for j := 0; j < len(calls); j++ {
		if _, ok := okTick(calls[j]); ok {
			continue
		}
		// A tick in flight during the flush may meet NOSCRIPT on some of
		// its commands only: it is sent again whole.
		noscript := calls[j].pipeline && len(calls[j].cmds) == len(names)
		for _, s := range calls[j].cmds {
			noscript = noscript && s.name == "evalsha" && (s.err == nil || s.noscript())
		}
		if noscript && j+2 < len(calls) &&
			!calls[j+1].pipeline && calls[j+1].cmds[0].name == "script load" && calls[j+1].cmds[0].err == nil &&
			calls[j+1].cmds[0].sha == renewSHA {
			if _, ok := okTick(calls[j+2]); ok {
				reloads++
				j += 2
				continue
			}
		}
		t.Errorf("master 0 after SCRIPT FLUSH: unexpected call %v in %v", calls[j], calls)
	}
	if reloads != 1 {
		t.Errorf("master 0 after SCRIPT FLUSH: %d ticks met NOSCRIPT, loaded the script and renewed, want 1: %v", reloads, calls)
	}
	for i, h := range hooks[1:] {
		for _, r := range h.take() {
			if _, ok := okTick(r); !ok {
				t.Errorf("master %d, during the flush of master 0: renewal tick sent %v, want a pipeline of %d EVALSHA that succeed", i+1, r, len(names))
			}
		}
	}
	for _, name := range names {
		// Renewed since: most of a TTL left.
		rc := newRedis(addrs[0])
		d, err := rc.PTTL(ctx, "latchkey:{"+name+"}:1").Result()
		_ = rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		if d < testTTL-testRenew-theftMargin {
			t.Errorf("master 0 after SCRIPT FLUSH: %q has PTTL %v, want at least %v", name, d, testTTL-testRenew-theftMargin)
		}
	}
	for _, l := range leases {
		if err := context.Cause(l.Context()); err != nil {
			t.Errorf("a lease ended: %v", err)
		}
	}
}
