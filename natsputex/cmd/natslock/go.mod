module github.com/latchkey-go/latchkey/natsputex/cmd/natslock

go 1.26.0

require (
	github.com/latchkey-go/latchkey/natsputex v0.0.0
	github.com/nats-io/nats.go v1.53.1
)

require (
	github.com/anishathalye/porcupine v1.3.1 // indirect
	github.com/klauspost/compress v1.18.5 // indirect
	github.com/latchkey-go/latchkey/locks v0.0.0 // indirect
	github.com/nats-io/nkeys v0.4.15 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.50.0 // indirect
	golang.org/x/sys v0.43.0 // indirect
)

replace (
	github.com/latchkey-go/latchkey/contracttest => ../../../contracttest
	github.com/latchkey-go/latchkey/contracttest/testenv/natsenv => ../../../contracttest/testenv/natsenv
	github.com/latchkey-go/latchkey/locks => ../../../locks
	github.com/latchkey-go/latchkey/natsputex => ../..
)
