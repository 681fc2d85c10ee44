// Package natsfence makes a NATS JetStream key-value bucket refuse writes
// with stale fencing tokens. Use it on the bucket of your data, not the
// lock's: each guarded key carries, with its value, the lock name and the
// token of its last guarded write.
//
//	g, err := natsfence.New(kv)
//	...
//	_, err = g.Put(ctx, lease, "job-42", []byte("done"))
//	if errors.Is(err, fence.ErrStale) {
//		// a later holder of the lease's name has written: nothing changed
//	}
//	e, err := g.Get(ctx, "job-42") // e.Value, e.Token, e.Revision
//
// A guarded write reads the key, refuses a token below the one it carries
// ([fence.ErrStale]), and writes with a compare-and-set on the revision it
// read, retried (reading again) when another write got in between: so an
// older holder's write lands before the newer holder's or not at all.
// [Guard.Update] keeps your own compare-and-set on a revision;
// [Guard.Delete] leaves a tombstone that keeps the token, so a stale Put
// cannot bring a deleted key back.
//
// A key is fenced per key, under one lock name: a write under another
// name gets [ErrOtherName] (tokens of different names do not compare).
// Values are stored in an envelope: read them with [Guard.Get]. Writes
// that bypass the guard (kv.Put, kv.Delete, kv.Purge) lose their key's
// fence; a value no guard wrote is refused with [ErrNotFenced]. A guarded
// write costs a read and a compare-and-set: two round trips where an
// unguarded Put takes one.
package natsfence
