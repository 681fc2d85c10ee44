package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// TestAttackLayoutWithCreate: a semaphore of one layout exists; a Semaphore
// of the other layout made WithCreate acquires the name. "A name is one
// layout's semaphore ... so that a mistake cannot make two semaphores of one
// name": it must not create the other layout's slot queues beside it.
func TestAttackLayoutWithCreate(t *testing.T) {
	url, _ := amqpURL(t)
	for _, first := range []amqpsem.Layout{amqpsem.PythonLayout, amqpsem.DefaultLayout} {
		other := amqpsem.DefaultLayout
		if first.Name == "default" {
			other = amqpsem.PythonLayout
		}
		t.Run(first.Name+"-then-"+other.Name, func(t *testing.T) {
			name := atkName("wc" + first.Name)
			atkCleanup(t, url, name)
			c := atkDial(t, url, "")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := atkAdmin(t, c, amqpsem.WithLayout(first)).Create(ctx, name, 2); err != nil {
				t.Fatal(err)
			}
			s, err := atkDial(t, url, "", amqpsem.WithLayout(other), amqpsem.WithCreate(true)).Semaphore(3)
			if err != nil {
				t.Fatal(err)
			}
			var leases int
			for range 4 {
				l, err := s.TryAcquire(ctx, name)
				t.Logf("%s WithCreate(3) TryAcquire: %v", other.Name, err)
				if err == nil {
					leases++
					defer l.Release(context.Background())
				}
			}
			n, err := atkAdmin(t, c, amqpsem.WithLayout(other)).Max(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if n != 0 || leases != 0 {
				t.Errorf("%s semaphore %q exists: WithCreate made %d %s slots beside it, %d leases taken", first.Name, name, n, other.Name, leases)
			}
		})
	}
}

// TestAttackLayoutConcurrentCreate: two administrators of different layouts
// create the same name at once; at most one may succeed.
func TestAttackLayoutConcurrentCreate(t *testing.T) {
	url, _ := amqpURL(t)
	cp := atkDial(t, url, "")
	cd := atkDial(t, url, "")
	ap := atkAdmin(t, cp, amqpsem.WithLayout(amqpsem.PythonLayout))
	ad := atkAdmin(t, cd)
	for round := range 8 {
		name := atkName(fmt.Sprintf("cc%d", round))
		atkCleanup(t, url, name)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var wg sync.WaitGroup
		var ep, ed error
		wg.Go(func() { ep = ap.Create(ctx, name, 2) })
		wg.Go(func() { ed = ad.Create(ctx, name, 3) })
		wg.Wait()
		np, _ := ap.Max(ctx, name)
		nd, _ := ad.Max(ctx, name)
		cancel()
		if np > 0 && nd > 0 {
			t.Fatalf("round %d: both layouts created: python %d slots (err %v), default %d slots (err %v)", round, np, ep, nd, ed)
		}
		if (ep == nil) == (ed == nil) {
			t.Errorf("round %d: python err %v, default err %v", round, ep, ed)
		}
		if ep != nil && !errors.Is(ep, amqpsem.ErrOtherLayout) || ed != nil && !errors.Is(ed, amqpsem.ErrOtherLayout) {
			t.Errorf("round %d: refusal not ErrOtherLayout: python %v, default %v", round, ep, ed)
		}
	}
}

// TestAttackLayoutCommandEnv: the command's layout from AMQPSEM_LAYOUT and
// --layout, against the library's.
func TestAttackLayoutCommandEnv(t *testing.T) {
	url, _ := amqpURL(t)
	name := atkName("env")
	atkCleanup(t, url, name)
	env := []string{"AMQPSEM_URL=" + url}
	py := append(env, "AMQPSEM_LAYOUT=python")
	out, code := atkRun(t, 15*time.Second, py, "create", name, "2")
	if code != 0 {
		t.Fatalf("create via env python: %d %s", code, out)
	}
	out, code = atkRun(t, 15*time.Second, env, "create", name, "3")
	t.Logf("create default beside python: %d %s", code, out)
	if code != 1 {
		t.Errorf("create default beside python: exit %d: %s", code, out)
	}
	out, code = atkRun(t, 15*time.Second, py, "--layout", "default", "resize", name, "+1")
	t.Logf("resize --layout default with env python: %d %s", code, out)
	if code != 1 {
		t.Errorf("resize --layout default (env python) of a python semaphore: exit %d: %s", code, out)
	}
	out, code = atkRun(t, 15*time.Second, env, "resize", name, "5")
	if code != 1 {
		t.Errorf("resize default of a python semaphore: exit %d: %s", code, out)
	}
	c := atkDial(t, url, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := atkAdmin(t, c).Add(ctx, name, 1); !errors.Is(err, amqpsem.ErrOtherLayout) {
		t.Errorf("library default Add on python semaphore: %v", err)
	}
	if n, _ := atkAdmin(t, c).Max(ctx, name); n != 0 {
		t.Errorf("default layout slots of %q: %d", name, n)
	}
	if n, _ := atkAdmin(t, c, amqpsem.WithLayout(amqpsem.PythonLayout)).Max(ctx, name); n != 2 {
		t.Errorf("python layout slots of %q: %d, want 2", name, n)
	}
	out, code = atkRun(t, 15*time.Second, env, "status", name)
	t.Logf("status (default) of a python semaphore: %d %s", code, out)
	if !strings.Contains(out, "python") {
		t.Errorf("status in the default layout of a python semaphore does not say so: exit %d: %s", code, out)
	}
	out, code = atkRun(t, 15*time.Second, py, "--layout", "bogus", "status", name)
	if code != 64 {
		t.Errorf("--layout bogus: exit %d, want 64 (usage): %s", code, out)
	}
	out, code = atkRun(t, 15*time.Second, append(env, "AMQPSEM_LAYOUT=Python "), "create", name+"z", "1")
	t.Logf("AMQPSEM_LAYOUT='Python ': %d %s", code, out)
	if code == 0 && !strings.Contains(out, "python") {
		atkCleanup(t, url, name+"z")
	}
}
