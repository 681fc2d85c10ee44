module github.com/latchkey-go/latchkey

go 1.26
