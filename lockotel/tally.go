package lockotel

import (
	"context"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// counts are the counters of one series of attributes (the wrapper's, or
// one name's with [WithMetricNames]): the acquiring calls, the lease ends
// and the leases held, counted with atomic adds and reported by the
// observable instruments at each collection; and the measurement options
// of the histograms, made once.
type counts struct {
	calls   [numOps][numOutcomes]atomic.Int64
	ends    [numCauses]atomic.Int64
	held    atomic.Int64
	touched atomic.Bool // a lease was held: report held, even at 0

	callObs [numOps][numOutcomes][]metric.ObserveOption
	endObs  [numCauses][]metric.ObserveOption
	heldObs []metric.ObserveOption
	waitRec [numOps][numOutcomes][]metric.RecordOption
	holdRec [numCauses][]metric.RecordOption
}

// newCounts returns counts whose series carry base and, for calls, the
// operation and outcome, for ends the cause.
func newCounts(base ...attribute.KeyValue) *counts {
	n := &counts{}
	with := func(more ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(append(append([]attribute.KeyValue(nil), base...), more...)...))
	}
	for op := range numOps {
		for out := range numOutcomes {
			o := with(OperationKey.String(opNames[op]), OutcomeKey.String(outcomeNames[out]))
			n.callObs[op][out] = []metric.ObserveOption{o}
			n.waitRec[op][out] = []metric.RecordOption{o}
		}
	}
	for cause := range numCauses {
		o := with(CauseKey.String(causeNames[cause]))
		n.endObs[cause] = []metric.ObserveOption{o}
		n.holdRec[cause] = []metric.RecordOption{o}
	}
	n.heldObs = []metric.ObserveOption{with()}
	return n
}

// addHeld adds d to the leases held.
func (n *counts) addHeld(d int64) {
	if !n.touched.Load() {
		n.touched.Store(true)
	}
	n.held.Add(d)
}

// observe reports n's counters to o: those of calls and ends once
// counted, held once a lease was.
func (n *counts) observe(o metric.Observer, ins *instruments) {
	for op := range numOps {
		for out := range numOutcomes {
			if v := n.calls[op][out].Load(); v != 0 {
				o.ObserveInt64(ins.acquisitions, v, n.callObs[op][out]...)
			}
		}
	}
	for cause := range numCauses {
		if v := n.ends[cause].Load(); v != 0 {
			o.ObserveInt64(ins.ends, v, n.endObs[cause]...)
		}
	}
	if n.touched.Load() {
		o.ObserveInt64(ins.held, n.held.Load(), n.heldObs...)
	}
}

// tally is a wrapper's counts: one set of them, or one per name with
// [WithMetricNames].
type tally struct {
	all    *counts  // nil with WithMetricNames
	byName sync.Map // name → *counts, with WithMetricNames
	c      *core
}

// of returns the counts of name.
func (t *tally) of(name string) *counts {
	if t.all != nil {
		return t.all
	}
	if n, ok := t.byName.Load(name); ok {
		return n.(*counts)
	}
	n, _ := t.byName.LoadOrStore(name, newCounts(t.c.backend, t.c.kind, t.c.nameAttr(name)))
	return n.(*counts)
}

// observe is the callback of the observable instruments.
func (t *tally) observe(_ context.Context, o metric.Observer) error {
	ins := t.c.ins
	if t.all != nil {
		t.all.observe(o, ins)
		return nil
	}
	t.byName.Range(func(_, n any) bool {
		n.(*counts).observe(o, ins)
		return true
	})
	return nil
}
