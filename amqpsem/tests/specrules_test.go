package amqpsem_test

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// The specification's administration rules, observed at the broker.

// deletions consumes A[1..n] of name on a connection of its own, each
// with its slot number as consumer tag, and returns a function that
// waits for want cancel notifications (the broker cancels a consumer when
// its queue is deleted) and returns the slots in the order their queues
// were deleted.
func deletions(t *testing.T, u, name string, n int) func(want int) []int {
	t.Helper()
	r := rawConn(t, u)
	ch, err := r.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	cancels := ch.NotifyCancel(make(chan string, n))
	for i := 1; i <= n; i++ {
		if _, err := ch.Consume(amqpsem.DefaultLayout.Slot(name, i), strconv.Itoa(i), true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	return func(want int) []int {
		t.Helper()
		var got []int
		timeout := time.After(10 * time.Second)
		for len(got) < want {
			select {
			case tag := <-cancels:
				i, _ := strconv.Atoi(tag)
				got = append(got, i)
			case <-timeout:
				t.Fatalf("%d deletions seen in 10s, want %d: %v", len(got), want, got)
			}
		}
		select {
		case tag := <-cancels:
			t.Fatalf("a slot deleted beyond the %d expected: %s (after %v)", want, tag, got)
		case <-time.After(200 * time.Millisecond):
		}
		return got
	}
}

// Remove and Destroy delete slot queues in descending order, each delete
// waiting for its delete-ok; WithAscendingDelete ("Swiss cheese")
// deletes them in ascending order. The order is the one the broker
// cancelled the queues' consumers in.
func TestDeleteOrder(t *testing.T) {
	u, _ := amqpURL(t)
	ctx := tctx(t)
	c := dial(t, u)
	for _, tc := range []struct {
		ascending       bool
		remove, destroy []int
	}{
		{false, []int{6, 5, 4}, []int{3, 2, 1}},
		{true, []int{4, 5, 6}, []int{1, 2, 3}},
	} {
		name := uniqueName(t, u)
		a := admin(t, c, amqpsem.WithAscendingDelete(tc.ascending))
		if err := a.Create(ctx, name, 6); err != nil {
			t.Fatal(err)
		}
		deleted := deletions(t, u, name, 6)
		if ch, err := a.Remove(ctx, name, 3); err != nil || ch != (amqpsem.Change{Before: 6, After: 3}) {
			t.Fatalf("Remove(3) = %+v, %v", ch, err)
		}
		if got := deleted(3); !slices.Equal(got, tc.remove) {
			t.Errorf("ascending=%v: Remove(3) of 6 deleted slots in the order %v, want %v", tc.ascending, got, tc.remove)
		}
		if n, err := a.Destroy(ctx, name); err != nil || n != 3 {
			t.Fatalf("Destroy = %d, %v", n, err)
		}
		if got := deleted(3); !slices.Equal(got, tc.destroy) {
			t.Errorf("ascending=%v: Destroy of 3 deleted slots in the order %v, want %v", tc.ascending, got, tc.destroy)
		}
	}
}

// Remove of more slots than there are is refused and changes nothing,
// where the specification clamps to 0 (a documented deviation); Resize
// to 0 and Destroy remove them all.
func TestRemoveMoreThanThereAreRefused(t *testing.T) {
	u, _ := amqpURL(t)
	name := uniqueName(t, u)
	ctx := tctx(t)
	a := admin(t, dial(t, u))
	r := rawConn(t, u)
	if err := a.Create(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	if ch, err := a.Remove(ctx, name, 4); !errors.Is(err, amqpsem.ErrInvalidSlots) || ch.After != 3 {
		t.Fatalf("Remove(4) of 3 = %+v, %v; want ErrInvalidSlots and no change", ch, err)
	}
	checkSlots(t, r, name, 3)
	if ch, err := a.Resize(ctx, name, 0); err != nil || ch != (amqpsem.Change{Before: 3, After: 0}) {
		t.Fatalf("Resize(0) = %+v, %v", ch, err)
	}
	checkSlots(t, r, name, 0)
}
