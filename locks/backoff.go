package locks

import (
	"math/rand/v2"
	"time"
)

// Backoff is the fallback polling schedule of a blocking Lock or Acquire: the n-th wait without
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
		return invalidOption("backoff needs 0 < min <= max, got min %v max %v", b.Min, b.Max)
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
