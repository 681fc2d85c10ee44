package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// administer runs the administration verbs: create, resize, destroy,
// status and wait.
func administer(ctx context.Context, a *amqpsem.Admin, cfg *config, stdout io.Writer, fail func(int, string, ...any) int) int {
	name := cfg.name
	var err error
	switch cfg.verb {
	case "create":
		err = a.Create(ctx, name, cfg.slots)
		if err == nil {
			fmt.Fprintf(stdout, "created %s with %s\n", name, count(cfg.slots))
		}
	case "resize":
		err = resize(ctx, a, cfg, stdout)
	case "destroy":
		var n int
		n, err = a.Destroy(ctx, name)
		if err == nil && n == 0 {
			return fail(exitError, "%s", missing(ctx, a, cfg))
		}
		if err == nil {
			fmt.Fprintf(stdout, "destroyed %s (%s)\n", name, count(n))
		}
	case "status":
		var st amqpsem.Status
		st, err = a.Status(ctx, name)
		if err == nil && st.Slots == 0 && len(st.Removed) == 0 {
			return fail(exitError, "%s", missing(ctx, a, cfg))
		}
		if err == nil {
			printStatus(stdout, name, st)
		}
	case "wait":
		if err = a.WaitReleased(ctx, name); err == nil {
			fmt.Fprintf(stdout, "no removed slot of %s is held (every slot number checked)\n", name)
		}
	}
	if err != nil {
		return fail(code(err), "%s", message(err))
	}
	return exitOK
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
		fmt.Fprintf(stdout, "resized %s from %d to %s\n", cfg.name, ch.Before, count(ch.After))
	}
	return err
}

// missing explains a name without slots in this layout.
func missing(ctx context.Context, a *amqpsem.Admin, cfg *config) string {
	name, lay := cfg.name, cfg.lay
	msg := fmt.Sprintf("no semaphore %s in the %s layout (no slot queue %q)", name, lay.Name, lay.Slot(name, 1))
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
