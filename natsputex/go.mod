module github.com/latchkey-go/latchkey/natsputex

go 1.26
