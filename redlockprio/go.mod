module github.com/latchkey-go/latchkey/redlockprio

go 1.26
