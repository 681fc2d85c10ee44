module github.com/latchkey-go/latchkey/locks

go 1.26.0
