package locks

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Backoff is the fallback polling schedule of [Wait]: the n-th wait without
// a wake-up lasts a random time between Min/2 and min(Max, Min·2ⁿ) ("equal
// jitter"), so waiters that lost the same race spread out.
type Backoff struct {
	Min, Max time.Duration
}

// DefaultBackoff is the schedule backends use unless told otherwise.
var DefaultBackoff = Backoff{Min: 10 * time.Millisecond, Max: time.Second}

// Check reports an error matching [ErrInvalidOption] unless
// 0 < Min <= Max.
func (b Backoff) Check() error {
	if b.Min <= 0 || b.Max < b.Min {
		return InvalidOption("backoff needs 0 < min <= max, got min %v max %v", b.Min, b.Max)
	}
	return nil
}

// Delay returns the wait before retry number attempt (from 0).
func (b Backoff) Delay(attempt int) time.Duration {
	ceil := b.Min
	for i := 0; i < attempt && ceil < b.Max; i++ {
		ceil *= 2
	}
	ceil = min(ceil, b.Max)
	half := ceil / 2
	return half + rand.N(ceil-half+1)
}

// Wait calls try until it returns a value, or an error other than one
// matching [ErrNotAcquired], or until ctx ends. Between attempts it sleeps
// until a signal on wake (the broker's release notification), the back-off
// delay, or the [HeldError.RetryAfter] hint, whichever comes first. A nil
// wake means polling only.
//
// On failure Wait returns try's error; when ctx ends first it returns an
// error matching ctx.Err(). Wait itself holds nothing: try must leave nothing
// held when it fails.
func Wait[T any](ctx context.Context, wake <-chan struct{}, b Backoff, try func(ctx context.Context) (T, error)) (T, error) {
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
		if !errors.Is(err, ErrNotAcquired) {
			return zero, err
		}
		d := b.Delay(attempt)
		var held *HeldError
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
