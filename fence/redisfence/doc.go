// Package redisfence makes Redis refuse writes with stale fencing tokens:
// each guarded write is one Lua script that compares the lease's token
// with the fence key of its name, refuses a smaller one, raises the fence
// key to it, and writes. Nothing runs on Redis between the check and the
// write, so a stale holder cannot slip in.
//
//	g, err := redisfence.New(rc) // a *redis.Client or *redis.ClusterClient
//	...
//	err = g.Set(ctx, lease, "jobs:{42}:state", "done")
//	if errors.Is(err, fence.ErrStale) {
//		// a later holder of the lease's name has written: nothing changed
//	}
//
// [Guard.Set] and [Guard.HSet] cover the common writes; [NewScript] fences
// a Lua script of your own (it sees KEYS and ARGV as with EVAL, without
// the fence key and token the guard adds before them).
//
// Tokens are compared as decimal strings, exactly for every uint64 (Lua
// numbers are doubles). Fence keys (PREFIX + name, with the data key's
// hash tag: see [Guard.FenceKey]) never expire.
//
// On a Redis Cluster a script touches one slot, so the fence of a name
// lives in the slot of the data: every data key must carry a hash tag,
// and the fence is per name and hash tag. Keep the keys one name guards
// under one hash tag. A Cluster or a replica set fails over with
// asynchronous replication: a write acknowledged just before a failover
// may be lost, fence key and data together; the fence never accepts a
// smaller token over a larger one that survived.
package redisfence
