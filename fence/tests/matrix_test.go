package tests

import (
	"testing"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// The fencing matrix: every backend with fencing tokens against every
// guard. Holder A writes, is paused past its validity (its link
// black-holed: it neither renews nor hears of its loss; memlock, which
// has no link, is killed instead: the store keeps its hold until the TTL
// runs out, as for a paused process), B takes the name and writes, A runs
// again and writes with its old lease: the guard refuses it with
// fence.ErrStale and B's data stays (contracttest's PausedHolderRefused).
// StaleHolderRefused (A killed) runs beside it.

var matrixChecks = []string{"PausedHolderRefused", "StaleHolderRefused"}

// guardMatrix returns the guards, by name, each on its real server; the
// NATS KV guard gets a server of its own (apart from natsputex's).
func guardMatrix(t *testing.T) []struct {
	name string
	ns   contracttest.NewGuardedStore
} {
	return []struct {
		name string
		ns   contracttest.NewGuardedStore
	}{
		{"PostgreSQL", newSQLStore(postgres, nil)},
		{"MariaDB", newSQLStore(mariadb, nil)},
		{"Redis", newRedisStore(testenv.RedisAddr(t))},
		{"NATSKV", newNATSStore(t, natsURL(t))},
	}
}

func runMatrix(t *testing.T, nh contracttest.NewHarness) {
	for _, g := range guardMatrix(t) {
		t.Run(g.name, func(t *testing.T) {
			contracttest.RunFencingChecks(t, nh, g.ns, matrixChecks...)
		})
	}
}

func TestFencingMatrixMemlock(t *testing.T) { runMatrix(t, newMemHarness) }

func TestFencingMatrixNatsputex(t *testing.T) { runMatrix(t, newNatsputexHarness(t)) }

func TestFencingMatrixRedlockprio(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(map[int]string{1: "N1", 3: "N3"}[n], func(t *testing.T) {
			runMatrix(t, newRedlockprioHarness(t, n))
		})
	}
}

// TestFencingMatrixCatchesDefectiveGuard: with a holder really paused
// (natsputex, its link black-holed), PausedHolderRefused fails on a SQL
// guard that checks the token without raising the fence.
func TestFencingMatrixCatchesDefectiveGuard(t *testing.T) {
	contracttest.MustCatchStale(t, newNatsputexHarness(t), newSQLStore(postgres, checksWithoutRaising), "PausedHolderRefused")
}
