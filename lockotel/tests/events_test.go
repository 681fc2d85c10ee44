package tests

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/latchkey-go/latchkey/lockotel"
	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
	"github.com/latchkey-go/latchkey/locks/memlock"
)

// observableLocker is a memlock Locker that reports events, as a backend
// built on the driver kit does: during calls, and from elsewhere.
type observableLocker struct {
	inner  *memlock.Locker
	events driver.Events
	during []driver.Event // emitted inside every Lock and Release
}

func (o *observableLocker) Observe(fn func(driver.Event)) func() { return o.events.Observe(fn) }

func (o *observableLocker) Lock(ctx context.Context, name string) (locks.Lease, error) {
	for _, ev := range o.during {
		ev.Name = name
		o.events.Emit(ev)
	}
	return o.inner.Lock(ctx, name)
}

func (o *observableLocker) TryLock(ctx context.Context, name string) (locks.Lease, error) {
	return o.inner.TryLock(ctx, name)
}

var (
	_ locks.Locker      = (*observableLocker)(nil)
	_ driver.Observable = (*observableLocker)(nil)
)

// Every event kind lands in its metric, with its attributes.
func TestEventMetrics(t *testing.T) {
	tl := newTelemetry(t)
	fake := &observableLocker{inner: memClient(t, memlock.New()).Locker()}
	l := lockotel.WrapLocker(fake, tl.opts(lockotel.WithBackend("fake"))...)
	defer l.StopEvents()
	boom := errors.New("boom")
	for _, ev := range []driver.Event{
		{Kind: driver.EventRenewRound, Leases: 3, Duration: 20 * time.Millisecond},
		{Kind: driver.EventRenewRound, Leases: 3, Failed: 1, Duration: 40 * time.Millisecond},
		{Kind: driver.EventRenewFailed, Name: "a", Err: boom},
		{Kind: driver.EventQuorumError, Name: "a", Master: "127.0.0.1:1", Err: boom},
		{Kind: driver.EventQuorumError, Name: "a", Master: "127.0.0.1:2", Err: boom},
		{Kind: driver.EventQuorumError, Name: "b", Master: "127.0.0.1:2", Err: boom},
		{Kind: driver.EventTheft, Name: "a", Token: 7},
		{Kind: driver.EventAckWait, Name: "a", Duration: 300 * time.Millisecond},
		{Kind: driver.EventTakeover, Name: "a"},
		{Kind: driver.EventConfirmation, Name: "a", Duration: 2 * time.Second},
		{Kind: driver.EventVerifyFailed, Name: "a", Err: boom},
		{Kind: driver.EventResourceLocked, Name: "a"},
		{Kind: driver.EventResourceLocked, Name: "b"},
		{Kind: "not_a_kind_yet", Name: "a"},
	} {
		fake.events.Emit(ev)
	}
	fb := backend("fake")
	master := func(m string) attribute.KeyValue { return lockotel.MasterKey.String(m) }
	for _, c := range []struct {
		metric string
		attrs  []attribute.KeyValue
		want   int64
	}{
		{"latchkey.renew.failures", nil, 1},
		{"latchkey.quorum.errors", []attribute.KeyValue{master("127.0.0.1:1")}, 1},
		{"latchkey.quorum.errors", []attribute.KeyValue{master("127.0.0.1:2")}, 2},
		{"latchkey.thefts", nil, 1},
		{"latchkey.takeovers", nil, 1},
		{"latchkey.verify.failures", nil, 1},
		{"latchkey.resource_locked.retries", nil, 2},
	} {
		if got := tl.sum(t, c.metric, append(c.attrs, fb)...); got != c.want {
			t.Errorf("%s %v = %d, want %d", c.metric, c.attrs, got, c.want)
		}
	}
	for _, c := range []struct {
		metric string
		count  uint64
		sum    float64
	}{
		{"latchkey.renew.duration", 2, 0.06},
		{"latchkey.theft.ack_wait.duration", 1, 0.3},
		{"latchkey.takeover.confirmation.duration", 1, 2},
	} {
		n, s := tl.hist(t, c.metric, fb)
		if n != c.count || s < c.sum-1e-9 || s > c.sum+1e-9 {
			t.Errorf("%s: count %d sum %v, want %d and %v", c.metric, n, s, c.count, c.sum)
		}
		if u := tl.unit(t, c.metric); u != "s" {
			t.Errorf("%s unit %q", c.metric, u)
		}
	}
	for _, set := range tl.attrSets(t, "latchkey.quorum.errors") {
		if _, ok := set.Value(lockotel.NameKey); ok {
			t.Errorf("quorum errors carry a name without WithMetricNames")
		}
	}

	// After StopEvents, events are no longer recorded.
	l.StopEvents()
	l.StopEvents()
	fake.events.Emit(driver.Event{Kind: driver.EventTheft, Name: "a"})
	if got := tl.sum(t, "latchkey.thefts"); got != 1 {
		t.Errorf("thefts after StopEvents = %d, want 1", got)
	}
}

// An event on a name during a call becomes a span event of that call.
func TestEventsOnSpans(t *testing.T) {
	tl := newTelemetry(t)
	fake := &observableLocker{
		inner: memClient(t, memlock.New()).Locker(),
		during: []driver.Event{
			{Kind: driver.EventQuorumError, Master: "10.0.0.1:6379", Err: errors.New("i/o timeout")},
			{Kind: driver.EventAckWait, Token: 9, Duration: 250 * time.Millisecond},
		},
	}
	l := lockotel.WrapLocker(fake, tl.opts(lockotel.WithMetricNames())...)
	defer l.StopEvents()
	lease, err := l.Lock(tl.ctx, "spans")
	if err != nil {
		t.Fatal(err)
	}
	_ = lease.Release(tl.ctx)
	// An event on the name after the call is on no span.
	fake.events.Emit(driver.Event{Kind: driver.EventTheft, Name: "spans"})

	span := tl.lastSpan(t, "latchkey.lock")
	events := span.Events()
	if len(events) != 2 {
		t.Fatalf("lock span events %v, want 2", events)
	}
	if events[0].Name != "latchkey.quorum_error" || events[1].Name != "latchkey.ack_wait" {
		t.Errorf("span events %q, %q", events[0].Name, events[1].Name)
	}
	want := map[attribute.Key]attribute.Value{
		lockotel.MasterKey: attribute.StringValue("10.0.0.1:6379"),
		lockotel.ErrorKey:  attribute.StringValue("i/o timeout"),
	}
	for _, kv := range events[0].Attributes {
		if w, ok := want[kv.Key]; ok && w != kv.Value {
			t.Errorf("quorum_error event %s = %s", kv.Key, show(kv.Value))
		}
		delete(want, kv.Key)
	}
	if len(want) != 0 {
		t.Errorf("quorum_error event lacks %v", want)
	}
	var dur, tok bool
	for _, kv := range events[1].Attributes {
		dur = dur || (kv.Key == lockotel.DurationKey && kv.Value.AsFloat64() == 0.25)
		tok = tok || (kv.Key == lockotel.TokenKey && kv.Value.AsInt64() == 9)
	}
	if !dur || !tok {
		t.Errorf("ack_wait event attributes %v", events[1].Attributes)
	}
	if got := tl.sum(t, "latchkey.quorum.errors", name("spans")); got != 1 {
		t.Errorf("quorum errors with the name = %d, want 1 (WithMetricNames)", got)
	}
	if got := tl.sum(t, "latchkey.thefts", name("spans")); got != 1 {
		t.Errorf("thefts = %d, want 1", got)
	}
}

// WithoutEvents records no event; the wrapper's Observe passes
// subscriptions to the backend, so wrappers stack.
func TestWithoutEventsAndObserve(t *testing.T) {
	tl := newTelemetry(t)
	fake := &observableLocker{inner: memClient(t, memlock.New()).Locker()}
	l := lockotel.WrapLocker(fake, tl.opts(lockotel.WithoutEvents())...)
	var seen atomic.Int32
	stop := l.Observe(func(driver.Event) { seen.Add(1) })
	fake.events.Emit(driver.Event{Kind: driver.EventTakeover, Name: "x"})
	stop()
	fake.events.Emit(driver.Event{Kind: driver.EventTakeover, Name: "x"})
	if got := tl.sum(t, "latchkey.takeovers"); got != 0 {
		t.Errorf("takeovers recorded WithoutEvents: %d", got)
	}
	if seen.Load() != 1 {
		t.Errorf("observer through the wrapper saw %d events, want 1", seen.Load())
	}
	// A wrapper of a Locker that reports nothing gives a harmless stop.
	plain := lockotel.WrapLocker(memClient(t, memlock.New()).Locker(), tl.opts()...)
	plain.Observe(func(driver.Event) { t.Error("event from a memlock Locker") })()
	plain.StopEvents()
}
