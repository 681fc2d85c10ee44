package fence

import (
	"context"
	"fmt"
	"sync"
)

// Memory is an in-process guard: a map from name to the largest token
// that has written. It guards what the process itself holds, and stands in
// for a real guard in tests of users' code (with locks/memlock). It is
// safe for concurrent use; the zero value is not ready, use [NewMemory].
type Memory struct {
	mu     sync.Mutex
	newest map[string]uint64
}

// NewMemory returns an empty in-process guard.
func NewMemory() *Memory { return &Memory{newest: map[string]uint64{}} }

// Do runs fn if no larger token than lease's has written to lease's name,
// holding the guard's lock while fn runs, so that guarded writes are
// serialised. When fn returns nil, the name's token is raised to lease's;
// when fn fails, Do returns its error and the token is unchanged. A stale
// lease gets an error matching [ErrStale] and fn does not run. When ctx
// has ended, Do returns ctx.Err() without running fn.
func (m *Memory) Do(ctx context.Context, lease Lease, fn func() error) error {
	name, token, err := Check("fence", lease)
	if err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("fence: %w: nil function", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if newest := m.newest[name]; token < newest {
		return &StaleError{Name: name, Token: token, Newest: newest}
	}
	if err := fn(); err != nil {
		return err
	}
	m.newest[name] = token
	return nil
}

// Newest returns the largest token that has written to name, 0 if none.
func (m *Memory) Newest(name string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.newest[name]
}
