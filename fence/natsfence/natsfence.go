package natsfence

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/fence"
)

// ErrOtherName reports a write to a key that a lease of another name
// fenced: tokens of different names do not compare, so one key is written
// under one lock name.
var ErrOtherName = errors.New("natsfence: key fenced under another name")

// ErrNotFenced reports a key holding a value no guard wrote: the guard
// does not overwrite it.
var ErrNotFenced = errors.New("natsfence: value not written by a guard")

// magic begins every value a guard writes.
const magic = "LKF1"

const (
	kindValue     = 0
	kindTombstone = 1
)

// Entry is a guarded key's value with the fence it carries.
type Entry struct {
	Key      string
	Value    []byte
	Name     string // the lock name the key is fenced under
	Token    uint64 // the token of the last guarded write
	Revision uint64 // the KV revision, for [Guard.Update]
}

// Guard makes a NATS KV bucket (the data's, not the lock's) refuse
// writes with stale fencing tokens. Each key carries, with its value, the
// name and token of its last guarded write; a write with a smaller token
// is refused, and an accepted one is a compare-and-set on the key's
// revision, retried when another write got in between. A guarded delete
// leaves a tombstone that keeps the token, so that a stale write cannot
// bring the key back. Values are read back with [Guard.Get]. It is safe
// for concurrent use.
//
// Writes that bypass the guard (kv.Put, kv.Delete, kv.Purge) lose the
// fence of their key: only guarded writes are fenced.
type Guard struct{ kv jetstream.KeyValue }

// New returns a Guard on the bucket kv.
func New(kv jetstream.KeyValue) (*Guard, error) {
	if kv == nil {
		return nil, fmt.Errorf("natsfence: %w: nil bucket", fence.ErrInvalid)
	}
	return &Guard{kv: kv}, nil
}

// Put sets key to value if lease is not stale for key, and returns the
// new revision. A stale lease gets an error matching [fence.ErrStale]
// ([*fence.StaleError]) and nothing changes. Conflicting writes are
// retried until ctx ends; Put then returns an error wrapping ctx's.
//
// A lease with token 0 gets [fence.ErrNoToken]; a nil lease or an empty
// name or key, [fence.ErrInvalid]; both before any I/O.
func (g *Guard) Put(ctx context.Context, lease fence.Lease, key string, value []byte) (uint64, error) {
	return g.write(ctx, lease, key, kindValue, value, nil)
}

// Update sets key to value if lease is not stale for key and key's
// revision is still last, as [jetstream.KeyValue.Update]: a changed
// revision gives an error matching [jetstream.ErrKeyRevisionMismatch]
// and is not retried. Otherwise as [Guard.Put].
func (g *Guard) Update(ctx context.Context, lease fence.Lease, key string, value []byte, last uint64) (uint64, error) {
	return g.write(ctx, lease, key, kindValue, value, &last)
}

// Delete deletes key if lease is not stale for key, leaving a tombstone
// that carries the token ([Guard.Get] then reports the key not found).
// Otherwise as [Guard.Put].
func (g *Guard) Delete(ctx context.Context, lease fence.Lease, key string) error {
	_, err := g.write(ctx, lease, key, kindTombstone, nil, nil)
	return err
}

// Get returns key's entry, or an error matching [jetstream.ErrKeyNotFound]
// when the key has no value (never written, or deleted by the guard).
func (g *Guard) Get(ctx context.Context, key string) (Entry, error) {
	e, err := g.kv.Get(ctx, key)
	if err != nil {
		return Entry{}, fmt.Errorf("natsfence: get %q: %w", key, err)
	}
	ent, kind, err := decode(key, e)
	if err != nil {
		return Entry{}, err
	}
	if kind == kindTombstone {
		return Entry{}, fmt.Errorf("natsfence: get %q: %w", key, jetstream.ErrKeyNotFound)
	}
	return ent, nil
}

func (g *Guard) write(ctx context.Context, lease fence.Lease, key string, kind byte, value []byte, last *uint64) (uint64, error) {
	name, token, err := fence.Check("natsfence", lease)
	if err != nil {
		return 0, err
	}
	if key == "" {
		return 0, fmt.Errorf("natsfence: %w: empty key", fence.ErrInvalid)
	}
	if len(name) > 0xffff {
		return 0, fmt.Errorf("natsfence: %w: lease name of %d bytes, over 65535", fence.ErrInvalid, len(name))
	}
	data := encode(kind, name, token, value)
	for {
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("natsfence: %q: %w", key, err)
		}
		e, err := g.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			if last != nil && *last != 0 {
				return 0, fmt.Errorf("natsfence: update %q: %w", key, jetstream.ErrKeyRevisionMismatch)
			}
			rev, err := g.kv.Create(ctx, key, data)
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // another write created it: check its token
			}
			if err != nil {
				return 0, fmt.Errorf("natsfence: create %q: %w", key, err)
			}
			return rev, nil
		}
		if err != nil {
			return 0, fmt.Errorf("natsfence: get %q: %w", key, err)
		}
		cur, _, err := decode(key, e)
		if err != nil {
			return 0, err
		}
		if cur.Name != name {
			return 0, fmt.Errorf("%w: %q is fenced under %q, not %q", ErrOtherName, key, cur.Name, name)
		}
		if token < cur.Token {
			return 0, fmt.Errorf("natsfence: %q: %w", key, &fence.StaleError{Name: name, Token: token, Newest: cur.Token})
		}
		if last != nil && *last != e.Revision() {
			return 0, fmt.Errorf("natsfence: update %q: revision %d, not %d: %w", key, e.Revision(), *last, jetstream.ErrKeyRevisionMismatch)
		}
		rev, err := g.kv.Update(ctx, key, data, e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			if last != nil {
				return 0, fmt.Errorf("natsfence: update %q: %w", key, err)
			}
			continue // another write got in: check its token
		}
		if err != nil {
			return 0, fmt.Errorf("natsfence: update %q: %w", key, err)
		}
		return rev, nil
	}
}

// encode lays out a guarded value: magic, kind, token, name length, name,
// value.
func encode(kind byte, name string, token uint64, value []byte) []byte {
	b := make([]byte, 0, len(magic)+1+8+2+len(name)+len(value))
	b = append(b, magic...)
	b = append(b, kind)
	b = binary.BigEndian.AppendUint64(b, token)
	b = binary.BigEndian.AppendUint16(b, uint16(len(name)))
	b = append(b, name...)
	return append(b, value...)
}

func decode(key string, e jetstream.KeyValueEntry) (Entry, byte, error) {
	b := e.Value()
	const head = len(magic) + 1 + 8 + 2
	if len(b) < head || string(b[:len(magic)]) != magic {
		return Entry{}, 0, fmt.Errorf("%w: %q (revision %d)", ErrNotFenced, key, e.Revision())
	}
	kind := b[len(magic)]
	token := binary.BigEndian.Uint64(b[len(magic)+1:])
	n := int(binary.BigEndian.Uint16(b[len(magic)+9:]))
	if len(b) < head+n || kind > kindTombstone {
		return Entry{}, 0, fmt.Errorf("%w: %q (revision %d): malformed", ErrNotFenced, key, e.Revision())
	}
	return Entry{Key: key, Name: string(b[head : head+n]), Token: token, Value: b[head+n:], Revision: e.Revision()}, kind, nil
}
