package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/command"
)

// acquire runs cfg.rest (CMD and its arguments) while holding a slot of
// cfg.name, with the runner every command under a lease shares.
func acquire(ctx context.Context, c *amqpsem.Client, cfg *config, stdout, stderr io.Writer) int {
	name := cfg.name
	s, err := c.Semaphore()
	if err != nil {
		fmt.Fprintln(stderr, "amqpsem: "+message(err))
		return exitUsage
	}
	// Signals while waiting cancel the wait; then they go to CMD.
	sigs := command.CatchSignals()
	defer sigs.Stop()
	lease, err := acquireSlot(ctx, s, sigs, name, cfg.try)
	if err != nil {
		if errors.Is(err, amqpsem.ErrNoSlots) {
			// The library's message speaks of Admins and WithCreate.
			msg := strings.SplitN(message(err), " (", 2)[0]
			fmt.Fprintf(stderr, "amqpsem: acquire %s: %s: create it first (amqpsem create %s SLOTS), or check the name and --layout\n", name, msg, name)
			return exitError
		}
		fmt.Fprintf(stderr, "amqpsem: acquire %s: %s\n", name, message(err))
		return code(err)
	}
	defer lease.Release(context.Background())
	slot := lease.(locks.SlotLease).Slot()

	reaper, err := command.StartReaper("amqpsem", "")
	if err != nil {
		fmt.Fprintf(stderr, "amqpsem: no reaper: an amqpsem killed outright leaves its command running: %s\n", message(err))
	}
	defer reaper.Close()
	cmd := exec.Command(cfg.rest[0], cfg.rest[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(), "AMQPSEM_NAME="+name, "AMQPSEM_SLOT="+strconv.Itoa(slot))
	exit, err := command.RunLease(lease, cmd, command.Options{
		Grace: cfg.grace, Signals: sigs, Reaper: reaper,
		Logf: func(format string, a ...any) { fmt.Fprintf(stderr, "amqpsem: "+format+"\n", a...) },
	})
	switch {
	case exit == exitLost:
		fmt.Fprintf(stderr, "amqpsem: slot %d of %s lost while the command ran: %s\n", slot, name, message(context.Cause(lease.Context())))
	case err != nil:
		fmt.Fprintln(stderr, "amqpsem: "+message(err))
	}
	return exit
}

// acquireSlot waits for a slot (takes a free one with try) until ctx
// ends or a signal comes.
func acquireSlot(ctx context.Context, s *amqpsem.Semaphore, sigs *command.Signals, name string, try bool) (locks.Lease, error) {
	wctx, cancel := sigs.Context(ctx)
	defer cancel()
	if try {
		return s.TryAcquire(wctx, name)
	}
	return s.Acquire(wctx, name)
}
