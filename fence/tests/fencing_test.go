package tests

import (
	"testing"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// The contract suite's fencing checks on each guard, with memlock as the
// lock: a cut-off holder's late write is refused and its successor's data
// kept, racing first writes keep the successor's, one token writes twice,
// names are fenced apart, token 0 is refused.

func TestFencingPostgres(t *testing.T) {
	contracttest.RunFencingTests(t, newMemHarness, newSQLStore(postgres, nil))
}

func TestFencingMariaDB(t *testing.T) {
	contracttest.RunFencingTests(t, newMemHarness, newSQLStore(mariadb, nil))
}

func TestFencingRedis(t *testing.T) {
	contracttest.RunFencingTests(t, newMemHarness, newRedisStore(testenv.RedisAddr(t)))
}

func TestFencingNATS(t *testing.T) {
	contracttest.RunFencingTests(t, newMemHarness, newNATSStore(t, natsURL(t)))
}
