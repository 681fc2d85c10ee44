package main

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/natsputex"
)

// Outcomes of a start or stop command, as the metrics and /state name
// them.
const (
	outcomeOK     = "ok"
	outcomeFailed = "failed"
)

// status is what --metrics-addr serves: natslock's state, fed by the
// Supervisor's events, by its service and health check, and by a watch
// of the key. It is safe for concurrent use.
type status struct {
	key, token string

	mu             sync.Mutex
	phase          natsputex.Phase
	holder         string    // the holder's token in the key, when last read
	revision       uint64    // the key's revision, when last known
	fencingToken   uint64    // the token of the last start command, 0 before one
	lastRenewal    time.Time // the broker's time of this node's last write of the key
	takeovers      int64
	starts, stops  map[string]int64 // by outcome
	healthFailures int64
}

func newStatus(key, token string) *status {
	return &status{
		key: key, token: token, phase: natsputex.PhaseStandby,
		starts: map[string]int64{outcomeOK: 0, outcomeFailed: 0},
		stops:  map[string]int64{outcomeOK: 0, outcomeFailed: 0},
	}
}

// observe records e. Entering confirming or active from another phase
// is a takeover: this node took the key, free or from a silent holder.
func (s *status) observe(e natsputex.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := func(p natsputex.Phase) bool { return p == natsputex.PhaseConfirming || p == natsputex.PhaseActive }
	if held(e.Phase) && !held(s.phase) {
		s.takeovers++
	}
	s.phase = e.Phase
	if e.Holder != "" || e.Revision != 0 {
		s.holder, s.revision = e.Holder, e.Revision
	}
}

// service is svc with each start and stop counted by outcome.
func (s *status) service(svc natsputex.Service) natsputex.Service {
	if start := svc.Start; start != nil {
		svc.Start = func(ctx context.Context, token uint64) error {
			err := start(ctx, token)
			s.mu.Lock()
			s.starts[outcome(err)]++
			if err == nil {
				s.fencingToken = token
			}
			s.mu.Unlock()
			return err
		}
	}
	if stop := svc.Stop; stop != nil {
		svc.Stop = func(ctx context.Context) error {
			err := stop(ctx)
			s.mu.Lock()
			s.stops[outcome(err)]++
			s.mu.Unlock()
			return err
		}
	}
	return svc
}

// healthCheck is check with its failures counted, but for those of a
// check cut short because run (natslock's run) ended.
func (s *status) healthCheck(run context.Context, check natsputex.HealthCheck) natsputex.HealthCheck {
	return func(ctx context.Context, st natsputex.State) error {
		err := check(ctx, st)
		if err != nil && run.Err() == nil {
			s.mu.Lock()
			s.healthFailures++
			s.mu.Unlock()
		}
		return err
	}
}

// watchRenewals records the time the broker stored each write of this
// node's token in the key, until ctx ends. It opens a watch of the key
// (an ordered consumer), which is all it costs the broker.
func (s *status) watchRenewals(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.Watch(ctx, s.key, jetstream.UpdatesOnly())
	if err != nil {
		return err
	}
	go func() {
		defer func() { _ = w.Stop() }()
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			if token, _, _ := strings.Cut(string(e.Value()), "\n"); token == s.token {
				s.mu.Lock()
				s.lastRenewal = e.Created()
				s.mu.Unlock()
			}
		}
	}()
	return nil
}

func outcome(err error) string {
	if err != nil {
		return outcomeFailed
	}
	return outcomeOK
}

// snapshot is status as /state shows it.
type snapshot struct {
	Key                 string           `json:"key"`
	Token               string           `json:"token"`
	Phase               string           `json:"phase"`
	Holder              string           `json:"holder"`
	Revision            uint64           `json:"revision"`
	FencingToken        uint64           `json:"fencing_token"`
	LastRenewal         *time.Time       `json:"last_renewal"`
	Takeovers           int64            `json:"takeovers"`
	Starts              map[string]int64 `json:"starts"`
	Stops               map[string]int64 `json:"stops"`
	HealthCheckFailures int64            `json:"health_check_failures"`
}

func (s *status) snapshot() snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := snapshot{
		Key: s.key, Token: s.token, Phase: s.phase.String(), Holder: s.holder,
		Revision: s.revision, FencingToken: s.fencingToken, Takeovers: s.takeovers,
		Starts: map[string]int64{}, Stops: map[string]int64{}, HealthCheckFailures: s.healthFailures,
	}
	if !s.lastRenewal.IsZero() {
		t := s.lastRenewal
		snap.LastRenewal = &t
	}
	for k, v := range s.starts {
		snap.Starts[k] = v
	}
	for k, v := range s.stops {
		snap.Stops[k] = v
	}
	return snap
}
