module github.com/latchkey-go/latchkey/amqpsem

go 1.26.0

require (
	github.com/latchkey-go/latchkey/locks v0.1.0
	github.com/rabbitmq/amqp091-go v1.16.0
)
