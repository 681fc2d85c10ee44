package natsputex_test

import (
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/contracttest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
)

// TestChaos runs the randomized fault run on one embedded node: crashed,
// closed and impatient clients on a few names, every critical section
// checked for overlap, fencing and recovery. `mage chaos` runs it for
// minutes; here it runs for seconds.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes seconds")
	}
	url := natsenv.StartServer(t).URL()
	bucket := uniqueBucket("chaos")
	prepareBucket(t, url, bucket)
	contracttest.RunChaos(t, newHarnessFunc(url, bucket), contracttest.ChaosConfig{Duration: 5 * time.Second})
}
