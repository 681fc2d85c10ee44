package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/locks"
)

// TestQuorumChannelLoss: when the broker closes the channel holding a
// token while the connection lives (as its consumer timeout does), the
// lease ends with ErrLost and the token goes to the next client, with a
// greater fencing token.
func TestQuorumChannelLoss(t *testing.T) {
	c, _, ctx := internalClient(t)
	name := fmt.Sprintf("TestQuorumChannelLoss-%d", time.Now().UnixNano())
	if err := c.Quorum().Create(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Quorum().Destroy(context.Background(), name) })
	l, err := c.Quorum().Locker().Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	ql := l.(*QuorumLease)
	// A channel error the broker answers by closing the channel with
	// PRECONDITION_FAILED, as it does at a consumer timeout: an ack of
	// a delivery tag it never sent.
	_ = ql.tc.ch.Ack(ql.tag+1000, false)
	select {
	case <-l.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease did not end when its channel closed")
	}
	cause := context.Cause(l.Context())
	if !errors.Is(cause, locks.ErrLost) || errors.Is(cause, ErrSlotRemoved) {
		t.Fatalf("lease ended with %v, want ErrLost, not ErrSlotRemoved", cause)
	}
	if !c.Connected() {
		t.Fatal("the connection went too: the test wants a channel-only loss")
	}
	next, err := c.Quorum().Locker().Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.Token() <= l.Token() {
		t.Errorf("token after the channel's loss %d, before %d: want greater", next.Token(), l.Token())
	}
	t.Logf("lost with %v; next token %d after %d", cause, next.Token(), l.Token())
}
