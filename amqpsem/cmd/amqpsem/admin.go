package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/locks/command"
)

// administer runs the administration verbs: create, resize, destroy,
// status and wait.
func administer(ctx context.Context, a *amqpsem.Admin, cfg *config, stdout io.Writer, fail func(int, string, ...any) int) int {
	name := command.ShortName(cfg.name)
	var err error
	switch cfg.verb {
	case "create":
		err = a.Create(ctx, cfg.name, cfg.slots)
		if err == nil {
			fmt.Fprintf(stdout, "created %s with %s\n", name, count(cfg.slots))
		}
	case "resize":
		var exists bool
		if exists, err = existing(ctx, a, cfg); err == nil && !exists {
			msg := missing(ctx, a, cfg)
			if !strings.Contains(msg, "--layout") {
				msg += fmt.Sprintf(": create it first (amqpsem create %s SLOTS), or resize with --create", name)
			}
			return fail(exitError, "%s", msg)
		}
		if err == nil {
			err = resize(ctx, a, cfg, stdout)
		}
	case "destroy":
		var n int
		n, err = a.Destroy(ctx, cfg.name)
		if err == nil && n == 0 {
			return fail(exitError, "%s", missing(ctx, a, cfg))
		}
		if err == nil {
			fmt.Fprintf(stdout, "destroyed %s (%s)\n", name, count(n))
		}
	case "status":
		var st amqpsem.Status
		st, err = a.Status(ctx, cfg.name)
		if err == nil && st.Slots == 0 && len(st.Removed) == 0 {
			return fail(exitError, "%s", missing(ctx, a, cfg))
		}
		if err == nil {
			printStatus(stdout, name, st)
		}
	case "wait":
		if err = a.WaitReleased(ctx, cfg.name); err == nil {
			fmt.Fprintf(stdout, "no removed slot of %s is held (every slot number checked)\n", name)
		}
	}
	if err != nil {
		return fail(afterIO(err), "%s", cfg.message(err))
	}
	return exitOK
}

// existing reports whether the semaphore to resize exists, or may be
// created (--create). It is a snapshot taken before the change: a
// destroy between the two is not seen.
func existing(ctx context.Context, a *amqpsem.Admin, cfg *config) (bool, error) {
	if cfg.create {
		return true, nil
	}
	n, err := a.Max(ctx, cfg.name)
	return n > 0, err
}

// resize adds, removes or sets the slots as cfg says.
func resize(ctx context.Context, a *amqpsem.Admin, cfg *config, stdout io.Writer) error {
	var ch amqpsem.Change
	var err error
	switch cfg.delta {
	case '+':
		ch, err = a.Add(ctx, cfg.name, cfg.slots)
	case '-':
		ch, err = a.Remove(ctx, cfg.name, cfg.slots)
	default:
		ch, err = a.Resize(ctx, cfg.name, cfg.slots)
	}
	if err == nil {
		fmt.Fprintf(stdout, "resized %s from %d to %s\n", command.ShortName(cfg.name), ch.Before, count(ch.After))
	}
	return err
}

// missing explains a name without slots in this layout.
func missing(ctx context.Context, a *amqpsem.Admin, cfg *config) string {
	name, lay := cfg.name, cfg.lay
	msg := fmt.Sprintf("no semaphore %s in the %s layout (no slot queue %q)", command.ShortName(name), lay.Name, command.ShortName(lay.Slot(name, 1)))
	if others, err := a.OtherLayouts(ctx, name); err == nil && len(others) > 0 {
		msg += fmt.Sprintf("; it is a semaphore of the %s layout: use --layout %s", strings.Join(others, " and "), others[0])
	}
	return msg
}

// count returns "1 slot" or "n slots".
func count(n int) string {
	if n == 1 {
		return "1 slot"
	}
	return strconv.Itoa(n) + " slots"
}

func printStatus(w io.Writer, name string, st amqpsem.Status) {
	held := map[int]bool{}
	for _, i := range st.Held {
		held[i] = true
	}
	fmt.Fprintf(w, "semaphore %s (%s layout): %s, %d held\n", name, st.Layout, count(st.Slots), len(st.Held))
	for _, o := range st.OtherLayouts {
		fmt.Fprintf(w, "warning: %s also has slot queues in the %s layout: two semaphores share the name\n", name, o)
	}
	for i := 1; i <= st.Slots; i++ {
		state := "free"
		if held[i] {
			state = "held"
		}
		fmt.Fprintf(w, "slot %d: %s\n", i, state)
	}
	for _, i := range st.Removed {
		fmt.Fprintf(w, "slot %d: removed, still held\n", i)
	}
}
