package lockotel

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// flights are the wrapper's calls under way, by name, so that a backend
// event on a name becomes a span event of the calls on it.
type flights struct {
	mu     sync.Mutex
	byName map[string][]*flight
}

type flight struct{ span trace.Span }

func (f *flights) add(name string, span trace.Span) *flight {
	fl := &flight{span: span}
	f.mu.Lock()
	f.byName[name] = append(f.byName[name], fl)
	f.mu.Unlock()
	return fl
}

func (f *flights) remove(name string, fl *flight) {
	f.mu.Lock()
	defer f.mu.Unlock()
	list := f.byName[name]
	for i, x := range list {
		if x == fl {
			list[i] = list[len(list)-1]
			list[len(list)-1] = nil
			list = list[:len(list)-1]
			break
		}
	}
	if len(list) == 0 {
		delete(f.byName, name)
	} else {
		f.byName[name] = list
	}
}

// spans returns the spans of the calls under way on name.
func (f *flights) spans(name string) []trace.Span {
	f.mu.Lock()
	defer f.mu.Unlock()
	list := f.byName[name]
	if len(list) == 0 {
		return nil
	}
	spans := make([]trace.Span, len(list))
	for i, fl := range list {
		spans[i] = fl.span
	}
	return spans
}

// onEvent records a backend event: in its metric, and as a span event
// "latchkey.<kind>" on the wrapper's calls under way on its name.
func (c *core) onEvent(ev driver.Event) {
	ctx := context.Background()
	opt := c.eventOpt
	if c.metricNames && ev.Name != "" {
		opt = metric.WithAttributes(c.backend, c.nameAttr(ev.Name))
	}
	seconds := ev.Duration.Seconds()
	ins := c.ins
	switch ev.Kind {
	case driver.EventRenewRound:
		ins.renewDuration.Record(ctx, seconds, c.eventOpt) // a round is client-wide
	case driver.EventRenewFailed:
		ins.renewFailures.Add(ctx, 1, opt)
	case driver.EventQuorumError:
		attrs := []attribute.KeyValue{c.backend, MasterKey.String(ev.Master)}
		if c.metricNames && ev.Name != "" {
			attrs = append(attrs, c.nameAttr(ev.Name))
		}
		ins.quorumErrors.Add(ctx, 1, metric.WithAttributes(attrs...))
	case driver.EventTheft:
		ins.thefts.Add(ctx, 1, opt)
	case driver.EventAckWait:
		ins.ackWait.Record(ctx, seconds, opt)
	case driver.EventTakeover:
		ins.takeovers.Add(ctx, 1, opt)
	case driver.EventConfirmation:
		ins.confirmation.Record(ctx, seconds, opt)
	case driver.EventVerifyFailed:
		ins.verifyFailures.Add(ctx, 1, opt)
	case driver.EventResourceLocked:
		ins.resourceLocked.Add(ctx, 1, opt)
	}
	if ev.Name == "" || c.flights == nil {
		return
	}
	spans := c.flights.spans(ev.Name)
	if len(spans) == 0 {
		return
	}
	attrs := eventAttrs(ev)
	for _, s := range spans {
		s.AddEvent("latchkey."+string(ev.Kind), trace.WithAttributes(attrs...))
	}
}

// eventAttrs are the attributes of ev's span event: those of its fields
// that are set.
func eventAttrs(ev driver.Event) []attribute.KeyValue {
	var attrs []attribute.KeyValue
	if ev.Token != 0 {
		attrs = append(attrs, TokenKey.Int64(int64(ev.Token)))
	}
	if ev.Master != "" {
		attrs = append(attrs, MasterKey.String(ev.Master))
	}
	if ev.Duration != 0 {
		attrs = append(attrs, DurationKey.Float64(ev.Duration.Seconds()))
	}
	if ev.Err != nil {
		attrs = append(attrs, ErrorKey.String(ev.Err.Error()))
	}
	return attrs
}
