module github.com/latchkey-go/latchkey

go 1.26.0

require github.com/magefile/mage v1.17.2

require golang.org/x/mod v0.43.0
