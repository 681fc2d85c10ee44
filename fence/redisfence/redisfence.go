package redisfence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/latchkey-go/latchkey/fence"
)

// DefaultPrefix begins every fence key unless [WithPrefix] says otherwise.
const DefaultPrefix = "latchkey:fence:"

// staleCode begins the script's error reply for a stale token.
const staleCode = "FENCESTALE"

// prelude compares the lease's token (ARGV[1]) with the fence key's
// (KEYS[1]) as decimal strings, exact for every uint64, refuses a smaller
// one and raises the key to it; then it runs the body with KEYS and ARGV
// shifted past the fence key and the token.
const prelude = `local cur = redis.call('GET', KEYS[1])
local tok = ARGV[1]
if cur and (#cur > #tok or (#cur == #tok and cur > tok)) then
  return redis.error_reply('` + staleCode + ` ' .. cur)
end
if cur ~= tok then redis.call('SET', KEYS[1], tok) end
local keys, argv = {}, {}
for i = 2, #KEYS do keys[i - 1] = KEYS[i] end
for i = 2, #ARGV do argv[i - 1] = ARGV[i] end
return (function(KEYS, ARGV)
`

const epilogue = `
end)(keys, argv)`

// Script is a user's Lua script run behind the fence: see [NewScript].
type Script struct{ s *redis.Script }

// NewScript returns a Script that runs src, a Lua script body as given to
// EVAL (it sees KEYS and ARGV and returns a reply), only after the fence
// admitted the lease, in the same script call: nothing else runs on
// Redis between the check and src's writes. src must touch only the keys
// it is passed (on a Cluster, all in the slot of their shared hash tag).
func NewScript(src string) *Script { return &Script{s: redis.NewScript(prelude + src + epilogue)} }

var (
	setScript  = NewScript(`return redis.call('SET', KEYS[1], ARGV[1])`)
	hsetScript = NewScript(`return redis.call('HSET', KEYS[1], unpack(ARGV))`)
)

// Option configures a [Guard].
type Option func(*Guard) error

// WithPrefix sets the prefix of the fence keys; it may not contain '{' or
// '}' (the fence key's hash tag is the data key's). The default is
// [DefaultPrefix].
func WithPrefix(prefix string) Option {
	return func(g *Guard) error {
		if strings.ContainsAny(prefix, "{}") {
			return fmt.Errorf("redisfence: %w: prefix %q has a brace", fence.ErrInvalid, prefix)
		}
		g.prefix = prefix
		return nil
	}
}

// Guard makes Redis refuse writes with stale fencing tokens. Each guarded
// write is one Lua script that compares the lease's token with the fence
// key of its name, refuses a smaller one, raises the fence key, and
// writes. Fence keys never expire. It is safe for concurrent use.
//
// On a Redis Cluster (a *redis.ClusterClient), every data key must carry
// a hash tag ("{orders}:42"): the fence key of a name is then
// PREFIX{orders}NAME, in the same slot. Keep all the keys one name guards
// under one hash tag, so that they share one fence: a fence is per name
// and per hash tag. On a single Redis, untagged keys share the fence key
// PREFIXNAME.
type Guard struct {
	rc      redis.Scripter
	prefix  string
	cluster bool
}

// New returns a Guard writing through rc (a *redis.Client, a
// *redis.ClusterClient, a *redis.Ring with tagged keys...).
func New(rc redis.Scripter, opts ...Option) (*Guard, error) {
	if rc == nil {
		return nil, fmt.Errorf("redisfence: %w: nil client", fence.ErrInvalid)
	}
	g := &Guard{rc: rc, prefix: DefaultPrefix}
	if c, ok := rc.(*redis.ClusterClient); ok {
		if c == nil {
			return nil, fmt.Errorf("redisfence: %w: nil client", fence.ErrInvalid)
		}
		g.cluster = true
	}
	if c, ok := rc.(*redis.Client); ok && c == nil {
		return nil, fmt.Errorf("redisfence: %w: nil client", fence.ErrInvalid)
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("redisfence: %w: nil option", fence.ErrInvalid)
		}
		if err := opt(g); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// FenceKey returns the fence key of name for writes to dataKey: the
// prefix, the data key's hash tag if it has one, and the name.
func (g *Guard) FenceKey(name, dataKey string) string {
	if tag := hashTag(dataKey); tag != "" {
		return g.prefix + "{" + tag + "}" + name
	}
	return g.prefix + name
}

// Set sets key to value if lease is not stale, in one script call. A
// stale lease gets an error matching [fence.ErrStale] and nothing
// changes.
func (g *Guard) Set(ctx context.Context, lease fence.Lease, key, value string) error {
	_, err := g.Run(ctx, lease, setScript, []string{key}, value)
	return err
}

// HSet sets fields of the hash key (field, value, field, value...) if
// lease is not stale, in one script call, as [Guard.Set].
func (g *Guard) HSet(ctx context.Context, lease fence.Lease, key string, fieldValues ...string) error {
	if len(fieldValues) == 0 || len(fieldValues)%2 != 0 {
		return fmt.Errorf("redisfence: %w: HSet takes field, value pairs, got %d strings", fence.ErrInvalid, len(fieldValues))
	}
	args := make([]any, len(fieldValues))
	for i, v := range fieldValues {
		args[i] = v
	}
	_, err := g.Run(ctx, lease, hsetScript, []string{key}, args...)
	return err
}

// Run runs s with keys and args if lease is not stale, and returns its
// reply. The fence key is keys[0]'s ([Guard.FenceKey]). A stale lease gets
// an error matching [fence.ErrStale] ([*fence.StaleError]) and s does
// not run. The fence is raised before s runs, and stays raised if s
// fails: a raised fence only refuses smaller tokens.
//
// A lease with token 0 gets [fence.ErrNoToken]; a nil lease or script, an
// empty name, no keys, or (on a Cluster) a first key without a hash tag,
// [fence.ErrInvalid]; all before any I/O.
func (g *Guard) Run(ctx context.Context, lease fence.Lease, s *Script, keys []string, args ...any) (any, error) {
	name, token, err := fence.Check("redisfence", lease)
	if err != nil {
		return nil, err
	}
	switch {
	case s == nil:
		return nil, fmt.Errorf("redisfence: %w: nil script", fence.ErrInvalid)
	case len(keys) == 0:
		return nil, fmt.Errorf("redisfence: %w: a guarded write needs a data key", fence.ErrInvalid)
	case g.cluster && hashTag(keys[0]) == "":
		return nil, fmt.Errorf("redisfence: %w: key %q has no hash tag: on a Cluster the fence key shares the data key's", fence.ErrInvalid, keys[0])
	}
	tok := strconv.FormatUint(token, 10)
	allKeys := append([]string{g.FenceKey(name, keys[0])}, keys...)
	allArgs := append([]any{tok}, args...)
	v, err := s.s.Run(ctx, g.rc, allKeys, allArgs...).Result()
	if err != nil {
		if newest, ok := staleReply(err); ok {
			return nil, fmt.Errorf("redisfence: %w", &fence.StaleError{Name: name, Token: token, Newest: newest})
		}
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		return nil, fmt.Errorf("redisfence: %q: %w", name, err)
	}
	return v, nil
}

// Newest returns the largest token that has written under name to keys
// sharing dataKey's hash tag, or 0 if none has.
func (g *Guard) Newest(ctx context.Context, name, dataKey string) (uint64, error) {
	v, err := g.rc.EvalRO(ctx, `return redis.call('GET', KEYS[1])`, []string{g.FenceKey(name, dataKey)}).Text()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("redisfence: %q: reading the fence: %w", name, err)
	}
	return strconv.ParseUint(v, 10, 64)
}

// staleReply parses the script's stale-token error reply.
func staleReply(err error) (uint64, bool) {
	var re redis.Error
	if !errors.As(err, &re) {
		return 0, false
	}
	rest, ok := strings.CutPrefix(re.Error(), staleCode+" ")
	if !ok {
		return 0, false
	}
	n, perr := strconv.ParseUint(strings.TrimSpace(rest), 10, 64)
	return n, perr == nil
}

// hashTag returns key's Redis Cluster hash tag: what lies between its
// first '{' and the first '}' after it, when not empty.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return ""
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return ""
	}
	return key[i+1 : i+1+j]
}
