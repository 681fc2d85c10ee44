module github.com/latchkey-go/latchkey/amqpsem

go 1.26
