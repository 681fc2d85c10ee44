package tests

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
	"github.com/latchkey-go/latchkey/fence"
	"github.com/latchkey-go/latchkey/fence/natsfence"
	"github.com/latchkey-go/latchkey/fence/redisfence"
	"github.com/latchkey-go/latchkey/fence/sqlfence"
)

// BenchmarkGuardCost measures what a guard costs per write on each
// resource: every iteration makes the same write once unguarded and once
// through the guard, alternately, so that both see the same load, and
// reports both times and their ratio (guarded/plain). The unguarded SQL
// write is the same UPDATE in a transaction of its own.
func BenchmarkGuardCost(b *testing.B) {
	for _, d := range []sqlDB{postgres, mariadb} {
		b.Run(d.dialect.String(), func(b *testing.B) { benchSQL(b, d) })
	}
	b.Run("redis", benchRedis)
	b.Run("nats", benchNATS)
}

// pair runs plain and guarded b.N times each, alternately, and reports
// their costs and ratio.
func pair(b *testing.B, plain, guarded func(i int) error) {
	b.Helper()
	var tp, tg time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Alternate which goes first, so neither always follows the
		// other's commit.
		first, second, tf, ts := plain, guarded, &tp, &tg
		if i%2 == 1 {
			first, second, tf, ts = guarded, plain, &tg, &tp
		}
		t0 := time.Now()
		if err := first(i); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := second(i); err != nil {
			b.Fatal(err)
		}
		*tf += t1.Sub(t0)
		*ts += time.Since(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(tp.Microseconds())/n, "plain-µs/write")
	b.ReportMetric(float64(tg.Microseconds())/n, "guarded-µs/write")
	b.ReportMetric(float64(tg)/float64(tp), "guarded/plain")
}

func benchSQL(b *testing.B, d sqlDB) {
	ctx := b.Context()
	db := d.open(ctx, b)
	defer db.Close()
	g, err := sqlfence.New(d.dialect, sqlfence.WithTable(checkTable))
	if err != nil {
		b.Fatal(err)
	}
	if err := g.EnsureSchema(ctx, db); err != nil {
		b.Fatal(err)
	}
	s := &sqlStore{d: d, db: db}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+checkData+` (k VARCHAR(200) PRIMARY KEY, v TEXT NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	key := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	if _, err := db.ExecContext(ctx, s.upsert(), key, "0"); err != nil {
		b.Fatal(err)
	}
	update := `UPDATE ` + checkData + ` SET v = ? WHERE k = ?`
	if d.dialect == sqlfence.Postgres {
		update = `UPDATE ` + checkData + ` SET v = $1 WHERE k = $2`
	}
	write := func(tx *sql.Tx, i int) error {
		_, err := tx.ExecContext(ctx, update, fmt.Sprint(i), key)
		return err
	}
	lease := fence.Token(key, 1)
	pair(b, func(i int) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := write(tx, i); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}, func(i int) error {
		return g.Do(ctx, db, lease, func(tx *sql.Tx) error { return write(tx, i) })
	})
}

func benchRedis(b *testing.B) {
	ctx := b.Context()
	rc := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(b)})
	defer rc.Close()
	g, err := redisfence.New(rc)
	if err != nil {
		b.Fatal(err)
	}
	key := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	lease := fence.Token(key, 1)
	pair(b, func(i int) error {
		return rc.Set(ctx, key, fmt.Sprint(i), 0).Err()
	}, func(i int) error {
		return g.Set(ctx, lease, key, fmt.Sprint(i))
	})
}

func benchNATS(b *testing.B) {
	ctx := context.Background()
	kv := natsKV(b, natsURL(b))
	g, err := natsfence.New(kv)
	if err != nil {
		b.Fatal(err)
	}
	lease := fence.Token("bench", 1)
	pair(b, func(i int) error {
		_, err := kv.Put(ctx, "plain", []byte(fmt.Sprint(i)))
		return err
	}, func(i int) error {
		_, err := g.Put(ctx, lease, "guarded", []byte(fmt.Sprint(i)))
		return err
	})
}
