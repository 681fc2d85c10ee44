package amqpsem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/amqpsem"
	"github.com/latchkey-go/latchkey/locks"
)

// FuzzLayoutNames: for both layouts, a name is accepted or refused with
// ErrInvalidName, never a panic; an accepted name's queues are legal
// RabbitMQ queue names for every slot up to its SlotLimit and never collide with another
// accepted name's mutex.
func FuzzLayoutNames(f *testing.F) {
	for _, s := range []string{"jobs", "jobs-3-A", "jobs-A-3", "amq.x", "", "a\x00b", strings.Repeat("x", 250), "ünï", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		for _, l := range []amqpsem.Layout{amqpsem.DefaultLayout, amqpsem.PythonLayout} {
			err := l.CheckName(name)
			if err != nil {
				if !errors.Is(err, locks.ErrInvalidName) {
					t.Fatalf("CheckName(%q) = %v, want ErrInvalidName", name, err)
				}
				continue
			}
			limit := l.SlotLimit(name)
			if limit < 1 {
				t.Fatalf("accepted %q, which has no slot: SlotLimit = %d", name, limit)
			}
			for _, i := range []int{1, min(2, limit), limit} {
				for _, q := range []string{l.Slot(name, i), l.Holder(name, i)} {
					if len(q) > 255 || strings.HasPrefix(q, "amq.") {
						t.Fatalf("accepted %q, but its queue %q is not a legal queue name", name, q)
					}
					// A slot or holder queue must not be the mutex of
					// another accepted name.
					if l.CheckName(q) == nil && l.Mutex(q) == q {
						t.Fatalf("accepted %q, and also %q, the name of its queue %d", name, q, i)
					}
				}
			}
		}
	})
}
