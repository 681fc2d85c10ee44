module github.com/latchkey-go/latchkey/benchmarks

go 1.26
