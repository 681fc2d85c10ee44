package driver

import (
	"context"
	"errors"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// Wait calls try until it returns a value, or an error other than one
// matching [locks.ErrNotAcquired], or until ctx ends. Between attempts it sleeps
// until a signal on wake (the broker's release notification), the back-off
// delay, or the [locks.HeldError.RetryAfter] hint, whichever comes first. A nil
// wake means polling only.
//
// On failure Wait returns try's error; when ctx ends first it returns an
// error matching ctx.Err(). Wait itself holds nothing: try must leave nothing
// held when it fails.
func Wait[T any](ctx context.Context, wake <-chan struct{}, b locks.Backoff, try func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for attempt := 0; ; attempt++ {
		v, err := try(ctx)
		if err == nil {
			return v, nil
		}
		if cerr := ctx.Err(); cerr != nil {
			if errors.Is(err, cerr) {
				return zero, err
			}
			return zero, cerr
		}
		if !errors.Is(err, locks.ErrNotAcquired) {
			return zero, err
		}
		d := b.Delay(attempt)
		var held *locks.HeldError
		if errors.As(err, &held) && held.RetryAfter > 0 && held.RetryAfter < d {
			d = held.RetryAfter
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return zero, ctx.Err()
		case <-wake:
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
		}
	}
}

// Sleep waits for d, or until ctx ends, and then returns ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
