module github.com/latchkey-go/latchkey/fence/tests

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/jackc/pgx/v5 v5.13.0
	github.com/latchkey-go/latchkey/contracttest v0.1.0
	github.com/latchkey-go/latchkey/fence v0.1.0
	github.com/latchkey-go/latchkey/locks v0.1.0
	github.com/latchkey-go/latchkey/natsputex v0.1.0
	github.com/latchkey-go/latchkey/redlockprio v0.1.0
	go.uber.org/goleak v1.3.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/latchkey-go/latchkey/contracttest/testenv/natsenv v0.1.0
	github.com/latchkey-go/latchkey/fence/natsfence v0.1.0
	github.com/latchkey-go/latchkey/fence/redisfence v0.1.0
	github.com/nats-io/nats.go v1.55.0
	github.com/redis/go-redis/v9 v9.23.0
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
