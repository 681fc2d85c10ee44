package natsputex_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// Errors of bad input read "natsputex: op ...: cause" with the name once,
// cut past 200 bytes, and one sentinel: a bad bucket or key names itself
// in its cause only, and a bad token is an invalid option, not also an
// invalid name.
func TestBadInputMessages(t *testing.T) {
	long := strings.Repeat("k", 1<<20)
	_, newErr := natsputex.New(context.Background(), nil, long)
	for _, tc := range []struct {
		what string
		err  error
		is   error
		want string
	}{
		{"New, 1 MiB bucket", newErr, locks.ErrInvalidName, `natsputex: new: locks: invalid name "` + strings.Repeat("k", 200) + `"...(1048576 bytes): NATS KV bucket is 1048576 bytes long`},
		{"bucket with a space", natsputex.CheckSupervisor("a b", "k", "tok"), locks.ErrInvalidName, `natsputex: new: locks: invalid name "a b": NATS KV bucket must not contain ' '`},
		{"key with a space", natsputex.CheckSupervisor("b", "k k", "tok"), locks.ErrInvalidName, `natsputex: supervisor: locks: invalid name "k k": NATS KV key must not contain ' '`},
		{"1 MiB key", natsputex.CheckSupervisor("b", long, "tok"), locks.ErrInvalidName, `natsputex: supervisor: locks: invalid name "` + strings.Repeat("k", 200) + `"...(1048576 bytes): NATS KV key is`},
		{"empty token", natsputex.CheckSupervisor("b", "k", ""), locks.ErrInvalidOption, `natsputex: supervisor "k": locks: invalid option: token must not be empty, got ""`},
	} {
		msg := tc.err.Error()
		if !errors.Is(tc.err, tc.is) || !strings.HasPrefix(msg, tc.want) || len(msg) > 600 || strings.Count(msg, "locks: ") != 1 {
			t.Errorf("%s: %.400q (%d bytes), want it to start %q, match %v, one sentinel, at most 600 bytes", tc.what, msg, len(msg), tc.want, tc.is)
		}
	}
}
