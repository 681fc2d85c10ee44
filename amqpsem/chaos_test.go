package amqpsem_test

import (
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
)

// TestChaosMutex runs the randomized fault run on the exclusive-queue
// mutex, crashes black-holing the client's link (so recovery takes the
// heartbeat bound): every critical section is checked for overlap and
// every crashed holder for recovery. `mage chaos` runs it for minutes;
// here it runs for seconds.
func TestChaosMutex(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes seconds")
	}
	contracttest.RunChaos(t, newHarness(blackHole, false), contracttest.ChaosConfig{Duration: 5 * time.Second})
}

// TestChaosSemaphore is TestChaosMutex on a one-slot persistent semaphore,
// crashes closing the client's socket.
func TestChaosSemaphore(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes seconds")
	}
	contracttest.RunChaos(t, newHarness(closeSocket, true), contracttest.ChaosConfig{Duration: 5 * time.Second})
}
