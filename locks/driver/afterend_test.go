package driver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// AfterEnd runs its function once the lease ends, by whatever ends it,
// once its context has ended; stop before the end prevents it; after
// the end it runs at once.
func TestLeaseAfterEnd(t *testing.T) {
	l := driver.NewLease(context.Background(), driver.Spec{Name: "n"})
	ran := make(chan error, 3)
	record := func() { ran <- context.Cause(l.Context()) }
	stopped := l.AfterEnd(func() { t.Error("a stopped AfterEnd function ran") })
	l.AfterEnd(record)
	h := l.Handle().(interface{ AfterEnd(func()) func() bool })
	h.AfterEnd(record)
	if !stopped() {
		t.Error("stop before the end reported false")
	}
	if stopped() {
		t.Error("a second stop reported true")
	}
	select {
	case err := <-ran:
		t.Fatalf("ran before the end (cause %v)", err)
	case <-time.After(20 * time.Millisecond):
	}
	l.End(driver.Lost(nil))
	for range 2 {
		select {
		case err := <-ran:
			if err == nil {
				t.Error("ran before the lease's context ended")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("AfterEnd function did not run after the end")
		}
	}
	late := l.AfterEnd(record)
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("AfterEnd after the end did not run")
	}
	if late() {
		t.Error("stop after the end reported true")
	}
	if err := l.Release(context.Background()); !errors.Is(err, locks.ErrLost) {
		t.Errorf("Release after the loss: %v, want ErrLost", err)
	}
}
