package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
func acquire(ctx context.Context, c *amqpsem.Client, cfg *config, stdout, stderr io.Writer, logger *slog.Logger) int {
	name := cfg.name
	s, err := c.Semaphore(amqpsem.MaxSemaphoreSize) // any slot the broker has
	if err != nil {
		logger.Error("failed", slog.String("error", cfg.message(err)))
		return exitError
	}
	// Signals while waiting cancel the wait; then they go to CMD.
	sigs := command.CatchSignals()
	defer sigs.Stop()
	lease, err := acquireSlot(ctx, s, sigs, name, cfg.try)
	if err != nil {
		if errors.Is(err, amqpsem.ErrNoSlots) {
			// The library's message speaks of Admins and WithCreate.
			msg := strings.SplitN(cfg.message(err), " (", 2)[0]
			logger.Error("failed: create it first (amqpsem create "+command.ShortName(name)+" SLOTS), or check the name and --layout", slog.String("error", msg))
			return exitError
		}
		if errors.Is(err, locks.ErrNotAcquired) {
			// The expected outcome of --try: not an error.
			logger.Info("not acquired: every slot is held")
			return exitNotAcquired
		}
		if errors.Is(err, context.DeadlineExceeded) {
			logger.Warn("not acquired: --timeout passed", slog.String("error", cfg.message(err)))
			return exitNotAcquired
		}
		logger.Error("failed", slog.String("error", cfg.message(err)))
		return afterIO(err)
	}
	defer lease.Release(context.Background())
	slot := lease.(locks.SlotLease).Slot()

	reaper, err := command.StartReaper("amqpsem", "")
	if err != nil {
		logger.Warn("no reaper: an amqpsem killed outright leaves its command running", slog.Int("slot", slot), slog.String("error", cfg.message(err)))
	}
	defer reaper.Close()
	cmd := exec.Command(cfg.rest[0], cfg.rest[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(), "AMQPSEM_NAME="+name, "AMQPSEM_SLOT="+strconv.Itoa(slot))
	exit, err := command.RunLease(lease, cmd, command.Options{
		Grace: cfg.grace, Signals: sigs, Reaper: reaper,
		Logf: func(format string, a ...any) { logger.Warn(fmt.Sprintf(format, a...), slog.Int("slot", slot)) },
	})
	switch {
	case exit == exitLost:
		logger.Error("slot lost while the command ran", slog.Int("slot", slot), slog.String("error", cfg.message(context.Cause(lease.Context()))))
	case err != nil:
		logger.Error("running the command failed", slog.Int("slot", slot), slog.String("error", cfg.message(err)))
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
