package natsputex_test

import (
	"context"
	"os"
	"testing"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/natsputex"
)

// The environment of a holder process the suite starts (PausedHolder):
// the parent's servers and bucket.
const (
	childURLsEnv   = "NATSPUTEX_TEST_URLS"
	childBucketEnv = "NATSPUTEX_TEST_BUCKET"
)

func TestMain(m *testing.M) { contracttest.Main(m, newChildLocker) }

var _ contracttest.ProcessHarness = (*harness)(nil)

// ChildEnv lets a holder process reach the harness's servers and bucket;
// it uses the suite's timing (testR, testF, testC).
func (h *harness) ChildEnv() []string {
	return []string{childURLsEnv + "=" + h.urls, childBucketEnv + "=" + h.bucket}
}

// newChildLocker is the Locker of a holder process, as NewClient makes it.
func newChildLocker(ctx context.Context) (locks.Locker, func() error, error) {
	h := &harness{
		urls:   os.Getenv(childURLsEnv),
		bucket: os.Getenv(childBucketEnv),
		opts: []natsputex.Option{
			natsputex.WithRenewInterval(testR),
			natsputex.WithFailureThreshold(testF),
			natsputex.WithConfirmations(testC),
		},
	}
	c, err := h.NewClient(ctx)
	if err != nil {
		return nil, nil, err
	}
	return c.Locker(), c.Close, nil
}
