package contracttest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/latchkey-go/latchkey/locks"
)

// errStale is memStore's refusal of a stale token.
var errStale = errors.New("stale token")

// memStore is an in-memory GuardedStore: a fence per name and a value per
// key under one mutex, which a write holds from its check to its data
// write, as a database transaction holds the fence row. Its defects break
// it the two ways the fencing checks must catch.
type memStore struct {
	mu     sync.Mutex
	fence  map[string]uint64
	data   map[string]string
	defect string // "", "no-raise" or "raise-outside"
}

func newMemStore(defect string) NewGuardedStore {
	return func(context.Context, testing.TB) (GuardedStore, error) {
		return &memStore{fence: map[string]uint64{}, data: map[string]string{}, defect: defect}, nil
	}
}

func (s *memStore) Write(_ context.Context, lease locks.Lease, key, value string, inside func()) error {
	if lease.Token() == 0 {
		return errors.New("no token")
	}
	s.mu.Lock()
	if newest := s.fence[lease.Name()]; lease.Token() < newest {
		s.mu.Unlock()
		return fmt.Errorf("%w: %d < %d", errStale, lease.Token(), newest)
	}
	if s.defect != "no-raise" {
		s.fence[lease.Name()] = lease.Token()
	}
	if s.defect == "raise-outside" {
		s.mu.Unlock() // the raise commits on its own
		if inside != nil {
			inside()
		}
		s.mu.Lock()
	} else if inside != nil {
		inside()
	}
	s.data[key] = value
	s.mu.Unlock()
	return nil
}

func (s *memStore) Read(_ context.Context, key string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data[key], nil
}

func (s *memStore) IsStale(err error) bool { return errors.Is(err, errStale) }
func (s *memStore) Close() error           { return nil }

// NewGuardedStore makes memlock's harness a GuardHarness: TestMemlock
// runs FencedWrites with a memStore.
func (h *memHarness) NewGuardedStore(ctx context.Context, t testing.TB) (GuardedStore, error) {
	return newMemStore("")(ctx, t)
}

// bareHarness hides every optional interface of the harness it wraps.
type bareHarness struct{ Harness }

func TestMemlockFencedWrites(t *testing.T) {
	RunFencingTests(t, newMemHarness, newMemStore(""))
}

// TestConformanceFencedWrites: the conformance test FencedWrites runs the
// fencing checks on a GuardHarness, and skips on a harness that is not
// one.
func TestConformanceFencedWrites(t *testing.T) {
	if r := runRecorded(t, testFencedWrites, newMemHarness); r.Failed() || r.skipped != "" {
		t.Errorf("FencedWrites on a GuardHarness: failures %q, skipped %q", r.failures, r.skipped)
	}
	bare := func(ctx context.Context, t testing.TB) (Harness, error) {
		h, err := newMemHarness(ctx, t)
		return bareHarness{h}, err
	}
	if r := runRecorded(t, testFencedWrites, bare); r.skipped == "" {
		t.Errorf("FencedWrites without a GuardHarness did not skip (failures %q)", r.failures)
	}
}

// TestFencingCatchesBrokenGuards: the fencing checks fail on a guard that
// checks without raising the fence, and on one that raises it apart from
// the write.
func TestFencingCatchesBrokenGuards(t *testing.T) {
	t.Run("checks without raising", func(t *testing.T) {
		MustCatchStale(t, newMemHarness, newMemStore("no-raise"), "StaleHolderRefused", "PausedHolderRefused")
	})
	t.Run("raises outside the write", func(t *testing.T) {
		MustCatchStale(t, newMemHarness, newMemStore("raise-outside"), "FirstWritesRace")
	})
}
