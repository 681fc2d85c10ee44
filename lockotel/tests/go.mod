module github.com/latchkey-go/latchkey/lockotel/tests

go 1.26.0

require (
	github.com/latchkey-go/latchkey/amqpsem v0.0.0
	github.com/latchkey-go/latchkey/contracttest v0.0.0
	github.com/latchkey-go/latchkey/contracttest/testenv/natsenv v0.0.0
	github.com/latchkey-go/latchkey/lockotel v0.0.0
	github.com/latchkey-go/latchkey/locks v0.0.0
	github.com/latchkey-go/latchkey/natsputex v0.0.0
	github.com/latchkey-go/latchkey/redlockprio v0.0.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

replace (
	github.com/latchkey-go/latchkey/amqpsem => ../../amqpsem
	github.com/latchkey-go/latchkey/contracttest => ../../contracttest
	github.com/latchkey-go/latchkey/contracttest/testenv/natsenv => ../../contracttest/testenv/natsenv
	github.com/latchkey-go/latchkey/lockotel => ..
	github.com/latchkey-go/latchkey/locks => ../../locks
	github.com/latchkey-go/latchkey/natsputex => ../../natsputex
	github.com/latchkey-go/latchkey/redlockprio => ../../redlockprio
)
