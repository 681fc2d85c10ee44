package natsputex_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// TestAttack2NatslockSIGTERMWhileConfirming: natslock's --help: "A
// standby starts no earlier than (F+C)*R after the last renewal, so the
// stop command has margin + C*R to finish: choose -c for your slowest
// stop", and "On SIGTERM ... natslock stops the service and blanks the
// key". Three nodes with -r 200ms -f 3 -c 3 (the stop command has margin
// + C·R = 700ms); node-a's stop command takes 500ms. node-a is cut off
// (a black hole); node-b or node-c takes its key over and confirms; an
// operator's SIGTERM then reaches that node (a rolling restart during a
// failover). The remaining standby must not start its service while
// node-a's still runs. (Fails now, 3 runs of 3: the SIGTERMed node
// exited 0 and blanked the key; the other started ~190ms before node-a's
// stop command finished.)
func TestAttack2NatslockSIGTERMWhileConfirming(t *testing.T) {
	requireNanoDate(t)
	bin, url, bucket := natslockEnv(t, "atk2natslockconf")
	const key = "spof-service"
	proxy := testenv.NewProxy(t, strings.TrimPrefix(url, "nats://"))
	flags := []string{"-r", "200ms", "-f", "3", "-c", "3"}
	a := startNatslock(t, bin, "nats://"+proxy.Addr(), bucket, key, "node-a", append(flags,
		"-stop", `sleep 0.5; echo "stop $(date +%s%N)" >> "$STATE"`)...)
	waitFor(t, 10*time.Second, "node-a starts its service", func() bool { return a.lastState() == "start" })
	b := startNatslock(t, bin, url, bucket, key, "node-b", flags...)
	c := startNatslock(t, bin, url, bucket, key, "node-c", flags...)
	time.Sleep(time.Second)
	proxy.BlackHole()
	var taker, other *lockProc
	waitFor(t, 5*time.Second, "a standby takes the key over", func() bool {
		switch {
		case strings.Contains(b.logs(), "confirming"):
			taker, other = b, c
		case strings.Contains(c.logs(), "confirming"):
			taker, other = c, b
		}
		return taker != nil
	})
	_ = taker.cmd.Process.Signal(syscall.SIGTERM)
	<-taker.done
	waitFor(t, 5*time.Second, "the other standby starts", func() bool { return other.lastState() == "start" })
	time.Sleep(500 * time.Millisecond)
	proxy.Restore()
	for _, p := range []*lockProc{a, taker, other} {
		for _, e := range p.events(t) {
			t.Logf("%s %s %s", e.node, e.kind, e.at.Format("15:04:05.000"))
		}
	}
	t.Logf("%s got SIGTERM while confirming: exit %v", taker.name, fmt.Sprint(taker.cmd.ProcessState))
	checkNoOverlap(t, a, b, c)
}
