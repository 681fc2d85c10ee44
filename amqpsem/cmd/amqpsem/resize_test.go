package main_test

import (
	"strings"
	"testing"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// resize takes one signed count or a plain size; it refuses a semaphore
// that does not exist unless --create is given; what only the broker's
// state makes wrong is an error (exit 1), not a usage error; --try on a
// busy semaphore is no ERROR line.
func TestResize(t *testing.T) {
	url := testenv.AMQPURL(t)
	bin := cmdtest.Build(t, ".")
	name, other := uniqueName(), uniqueName()
	run, expect := runner(t, bin, "--url", url)
	t.Cleanup(func() { run("destroy", name); run("destroy", other) })

	for _, count := range []string{"3", "+2"} {
		out := expect(1, "create it first", "resize", name, count)
		if strings.Count(out, "\n") != 1 {
			t.Errorf("resize %s of a missing semaphore: more than one line:\n%s", count, out)
		}
	}
	expect(1, "no semaphore", "status", name)
	expect(0, "resized "+name+" from 0 to 3 slots", "--create", "resize", name, "3")
	expect(0, "from 3 to 5 slots", "resize", name, "+2")
	expect(0, "from 5 to 4 slots", "resize", name, "-1")
	expect(1, "cannot remove 9 slots of 4", "resize", name, "-9")
	expect(64, `"++2"`, "resize", name, "++2")
	expect(0, "4 slots", "status", name)

	// --try with every slot held: exit 3 and an INFO line, no ERROR.
	expect(0, "created", "create", other, "1")
	ch := holder(t, url)
	hold(t, ch, other+"-1-B")
	out := expect(3, "level=INFO msg=\"not acquired: every slot is held\"", "--try", "acquire", other, "--", "true")
	if strings.Contains(out, "level=ERROR") {
		t.Errorf("--try on a busy semaphore logs an ERROR:\n%s", out)
	}
	let(t, ch, other+"-1-B")
}
