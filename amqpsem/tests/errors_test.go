package amqpsem_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/locks"
)

// TestErrorShape: every call's error reads "amqpsem: op "name": cause"
// (the package doc), "amqpsem: " and "locks: " once, the name once (left
// out when the cause names it: an invalid name, a name held), cut past
// 200 bytes; and it matches its sentinels with errors.Is. Bad input fails
// before any I/O; a busy name is held by another client (ErrAllHeld for
// a semaphore) or by this one.
func TestErrorShape(t *testing.T) {
	u, _ := amqpURL(t)
	name := newName(t, u)
	ctx := tctx(t)
	c := dial(t, u)
	other := dial(t, u)
	a := admin(t, c)
	sem := semaphore(t, c, 1)
	q := c.Quorum()
	if err := a.Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	lockName, semName := name+"-lock", name
	for _, hold := range []func() (locks.Lease, error){
		func() (locks.Lease, error) { return other.Locker().TryLock(ctx, lockName) },
		func() (locks.Lease, error) { return semaphore(t, other, 1).TryAcquire(ctx, semName) },
	} {
		l, err := hold()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Release(context.Background()) })
	}
	mine, err := c.Locker().TryLock(ctx, name+"-mine")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mine.Release(context.Background()) })
	long := strings.Repeat("n", 1<<20)
	cut := `"` + strings.Repeat("n", 200) + `"...(1048576 bytes)`
	_, dialURL := amqpsem.Dial(ctx, "http://x")
	_, dialOption := amqpsem.Dial(ctx, u, amqpsem.WithHeartbeat(-1))
	_, adminOption := c.Admin(amqpsem.WithHeartbeat(testHeartbeat))
	second := func(_ any, err error) error { return err }

	for _, tc := range []struct {
		what string
		err  error
		is   error
		want string
	}{
		{"Locker.TryLock, empty name", second(c.Locker().TryLock(ctx, "")), locks.ErrInvalidName, `amqpsem: trylock: locks: invalid name "": amqpsem name must not be empty`},
		{"Locker.Lock, a slot queue's name", second(c.Locker().Lock(ctx, "jobs-3-A")), locks.ErrInvalidName, `amqpsem: lock: locks: invalid name "jobs-3-A": must not end in`},
		{"Semaphore.TryAcquire, 1 MiB name", second(sem.TryAcquire(ctx, long)), locks.ErrInvalidName, `amqpsem: tryacquire: locks: invalid name ` + cut + `: amqpsem name is 1048576 bytes long`},
		{"Semaphore.Acquire, amq. name", second(sem.Acquire(ctx, "amq.x")), locks.ErrInvalidName, `amqpsem: acquire: locks: invalid name "amq.x": queue name "amq.x" starts with`},
		{"QuorumLocker.TryLock, empty name", second(q.Locker().TryLock(ctx, "")), locks.ErrInvalidName, `amqpsem: trylock: locks: invalid name ""`},
		{"Quorum.Create, empty name", q.Create(ctx, "", 1), locks.ErrInvalidName, `amqpsem: create: locks: invalid name ""`},
		{"Quorum.Destroy, empty name", q.Destroy(ctx, ""), locks.ErrInvalidName, `amqpsem: destroy: locks: invalid name ""`},
		{"Admin.Max, empty name", second(a.Max(ctx, "")), locks.ErrInvalidName, `amqpsem: max: locks: invalid name ""`},
		{"Admin.OtherLayouts, empty name", second(a.OtherLayouts(ctx, "")), locks.ErrInvalidName, `amqpsem: otherlayouts: locks: invalid name ""`},
		{"Admin.Status, empty name", second(a.Status(ctx, "")), locks.ErrInvalidName, `amqpsem: status: locks: invalid name ""`},
		{"Admin.WaitReleased, empty name", a.WaitReleased(ctx, ""), locks.ErrInvalidName, `amqpsem: waitreleased: locks: invalid name ""`},
		{"Admin.Create, empty name", a.Create(ctx, "", 2), locks.ErrInvalidName, `amqpsem: create: locks: invalid name ""`},
		{"Admin.Add, empty name", second(a.Add(ctx, "", 2)), locks.ErrInvalidName, `amqpsem: add: locks: invalid name ""`},
		{"Admin.Remove, empty name", second(a.Remove(ctx, "", 2)), locks.ErrInvalidName, `amqpsem: remove: locks: invalid name ""`},
		{"Admin.Resize, empty name", second(a.Resize(ctx, "", 2)), locks.ErrInvalidName, `amqpsem: resize: locks: invalid name ""`},
		{"Admin.Destroy, empty name", second(a.Destroy(ctx, "")), locks.ErrInvalidName, `amqpsem: destroy: locks: invalid name ""`},
		{"Admin.Create, 0 slots", a.Create(ctx, "s", 0), amqpsem.ErrInvalidSlots, `amqpsem: create "s": locks: invalid option: invalid slot count: slots must be in 1..`},
		{"Admin.Resize, -1 slots", second(a.Resize(ctx, "s", -1)), amqpsem.ErrInvalidSlots, `amqpsem: resize "s": locks: invalid option: invalid slot count: slots must be in 0..`},
		{"Client.Admin, a connection option", adminOption, locks.ErrInvalidOption, `amqpsem: admin: locks: invalid option: connection options are given to Dial`},
		{"Dial, http URL", dialURL, locks.ErrInvalidOption, `amqpsem: dial: locks: invalid option: URL http://x: `},
		{"Dial, negative heartbeat", dialOption, locks.ErrInvalidOption, `amqpsem: dial: locks: invalid option: `},
		{"Locker.TryLock, held by another client", second(c.Locker().TryLock(ctx, lockName)), locks.ErrNotAcquired, `amqpsem: trylock: locks: not acquired: "` + lockName + `" is held: queue "` + lockName + `": `},
		{"Locker.TryLock, held by this client", second(c.Locker().TryLock(ctx, name+"-mine")), locks.ErrNotAcquired, `amqpsem: trylock: locks: not acquired: "` + name + `-mine" is held by this client`},
		{"Semaphore.TryAcquire, every slot held", second(sem.TryAcquire(ctx, semName)), amqpsem.ErrAllHeld, `amqpsem: tryacquire: locks: not acquired: "` + semName + `" is held: every slot is held`},
	} {
		if tc.err == nil {
			t.Errorf("%s: nil error, want one matching %v", tc.what, tc.is)
			continue
		}
		msg := tc.err.Error()
		if !errors.Is(tc.err, tc.is) || !strings.HasPrefix(msg, tc.want) || len(msg) > 600 ||
			strings.Count(msg, "amqpsem: ") != 1 || strings.Count(msg, "locks: ") != 1 {
			t.Errorf("%s: %.400q (%d bytes), want it to start %q, match %v, say \"amqpsem: \" and \"locks: \" once, at most 600 bytes", tc.what, msg, len(msg), tc.want, tc.is)
		}
	}
}
