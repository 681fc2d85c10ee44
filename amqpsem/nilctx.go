package amqpsem

import (
	"context"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// checkCtx returns the error of a call given a nil ctx: every entry point
// of the package (Dial, Lock, TryLock, Acquire, TryAcquire, Release,
// Close and the Admin's methods) returns it, matching
// [locks.ErrInvalidOption], and does nothing else, rather than panic
// later inside a goroutine of the client. nil otherwise.
func checkCtx(ctx context.Context, op, name string) error {
	return driver.CheckContext(ctx, "amqpsem", op, name)
}
