module github.com/latchkey-go/latchkey/fence

go 1.26.0

require github.com/latchkey-go/latchkey/locks v0.1.0
