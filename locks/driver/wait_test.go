package driver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

func TestWaitWakesOnNotification(t *testing.T) {
	wake := make(chan struct{}, 1)
	free := false
	attempts := 0
	slow := locks.Backoff{Min: time.Hour, Max: time.Hour}
	time.AfterFunc(20*time.Millisecond, func() { wake <- struct{}{} })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := driver.Wait(ctx, wake, slow, func(context.Context) (int, error) {
		attempts++
		if free {
			return 42, nil
		}
		free = true // the next attempt, after the wake-up, succeeds
		return 0, locks.ErrNotAcquired
	})
	if err != nil || v != 42 || attempts != 2 {
		t.Fatalf("Wait = %v, %v after %d attempts; want 42, nil after 2", v, err, attempts)
	}
}

func TestWaitHonoursRetryAfter(t *testing.T) {
	start := time.Now()
	n := 0
	_, err := driver.Wait(context.Background(), nil, locks.Backoff{Min: time.Hour, Max: time.Hour}, func(context.Context) (int, error) {
		if n++; n < 3 {
			return 0, &locks.HeldError{Name: "n", RetryAfter: 10 * time.Millisecond}
		}
		return 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("Wait ignored the RetryAfter hint")
	}
}

func TestWaitReturnsContextError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err := driver.Wait(ctx, nil, locks.DefaultBackoff, func(context.Context) (int, error) {
		return 0, &locks.HeldError{Name: "n", Holder: "h"}
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want DeadlineExceeded", err)
	}
	if errors.Is(err, locks.ErrNotAcquired) {
		t.Fatal("a deadline was turned into ErrNotAcquired")
	}
}

func TestWaitStopsOnOtherErrors(t *testing.T) {
	boom := errors.New("boom")
	_, err := driver.Wait(context.Background(), nil, locks.DefaultBackoff, func(context.Context) (int, error) {
		return 0, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Wait = %v, want boom", err)
	}
}

func TestBackoff(t *testing.T) {
	b := locks.Backoff{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	if err := b.Check(); err != nil {
		t.Fatal(err)
	}
	for attempt := range 10 {
		ceil := min(b.Min<<attempt, b.Max)
		for range 100 {
			d := b.Delay(attempt)
			if d < ceil/2 || d > ceil {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", attempt, d, ceil/2, ceil)
			}
		}
	}
	for _, bad := range []locks.Backoff{{}, {Min: -1, Max: 1}, {Min: 2, Max: 1}} {
		if err := bad.Check(); !errors.Is(err, locks.ErrInvalidOption) {
			t.Errorf("Check(%+v) = %v", bad, err)
		}
	}
}
