// Package scripts holds the Lua source of every step redlockprio runs on a
// master, so that redlockprio and its tests (a module of their own) share
// one copy. The doc of each step is beside its use in redlockprio.
package scripts

// Acquire is the source of redlockprio's acquireScript.
const Acquire = `
local id, ttl, prio, inbox = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local floor, first = tonumber(ARGV[5]), tonumber(ARGV[6])
local n = #KEYS - 1
local member = ARGV[7]
local qk, qt
if member then
  n = n - 2
  qk, qt = KEYS[n + 2], KEYS[n + 3]
  if redis.call('EXISTS', qk) == 1 then
` + queueHead + `
    local h, hp, left = qhead(qk, qt)
    if h and h ~= member and hp >= prio then
      return {0, 0, tonumber(redis.call('GET', KEYS[1]) or '0'), h, left}
    end
  end
end
local function fence()
  local c = redis.call('INCR', KEYS[1])
  if c <= floor then
    c = floor + 1
    redis.call('SET', KEYS[1], c)
  end
  return c
end
local victim, vprio = 0, 0
for j = 0, n - 1 do
  local i = (first + j) % n + 2
  local h = redis.call('HMGET', KEYS[i], 'id', 'p')
  if h[1] == id then -- a retried call that had already granted
    return {1, i - 1, tonumber(redis.call('GET', KEYS[1]) or '0')}
  end
  if not h[1] then
    redis.call('HSET', KEYS[i], 'id', id, 'p', prio, 'ch', inbox)
    redis.call('PEXPIRE', KEYS[i], ttl)
    return {1, i - 1, fence()}
  end
  local p = tonumber(h[2]) or 0
  if p < prio and (victim == 0 or p < vprio) then victim, vprio = i, p end
end
if victim > 0 then
  local k = KEYS[victim]
  local old = redis.call('HMGET', k, 'id', 'p', 'ch', 'from')
  local pttl = redis.call('PTTL', k)
  redis.call('DEL', k)
  redis.call('HSET', k, 'id', id, 'p', prio, 'ch', inbox, 'from', old[1])
  local exp = tonumber(ttl)
  if pttl > exp then exp = pttl end
  redis.call('PEXPIRE', k, exp)
  return {2, victim - 1, fence(), old[1], vprio, pttl, old[3] or '', old[4] or ''}
end
local holder, minp = '', -1
for i = 2, n + 1 do
  local t = redis.call('PTTL', KEYS[i])
  if minp < 0 or t < minp then
    minp = t
    holder = redis.call('HGET', KEYS[i], 'id') or ''
  end
end
return {0, 0, tonumber(redis.call('GET', KEYS[1]) or '0'), holder, minp}
`

// Release is the source of redlockprio's releaseScript.
const Release = `
local tok = tonumber(ARGV[2])
if tok > 0 and tonumber(redis.call('GET', KEYS[2]) or '0') < tok then redis.call('SET', KEYS[2], tok) end
local deleted = 0
local h = redis.call('HMGET', KEYS[1], 'id', 'from')
if h[1] == ARGV[1] and not (ARGV[4] == '1' and h[2]) then
  redis.call('DEL', KEYS[1])
  deleted = 1
end
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], ARGV[1]) end
if KEYS[3] and ARGV[5] and ARGV[5] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[5])
  redis.call('ZREM', KEYS[4], ARGV[5])
end
if KEYS[3] and redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[3]) == 1 then
` + queueHead + `
  local h = qhead(KEYS[3], KEYS[4])
  local inbox = h and h ~= ARGV[6] and string.match(h, '^[^|]*|([^|]*)|')
  if inbox then redis.call('PUBLISH', inbox, 'W|' .. h) end
end
return deleted
`

// Raise is the source of redlockprio's raiseScript.
const Raise = `
local c = tonumber(redis.call('GET', KEYS[1]) or '0')
local tok = tonumber(ARGV[1])
if c < tok then redis.call('SET', KEYS[1], tok); c = tok end
if KEYS[2] and redis.call('HGET', KEYS[2], 'id') ~= ARGV[2] then return -1 end
return c
`

// Ident is the source of redlockprio's identScript.
const Ident = `
local v = redis.call('GET', KEYS[1])
if v then return tonumber(v) end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return tonumber(ARGV[1])
`

// Renew is the source of redlockprio's renewScript.
const Renew = `
local tok = tonumber(ARGV[3])
if tonumber(redis.call('GET', KEYS[2]) or '0') < tok then redis.call('SET', KEYS[2], tok) end
local h = redis.call('HMGET', KEYS[1], 'id', 'from')
if h[1] == ARGV[1] then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return 1
end
if h[2] == ARGV[1] then return -1 end
return 0
`

// queueHead defines qhead(q, qt): it drops the waiters of the queue q
// whose entries have expired by this master's clock (qt scores each
// member by its expiry in ms), a bounded number per call, then every
// expired entry still ahead of the first live one (each is removed once,
// so that work is amortized: a head is never a dead entry, however many
// waiters died), and returns the head (member, priority, ms its entry has
// left), or nil for an empty queue. A member is "<16 hex digits of ticket>|<inbox>|<waiter id>" and
// its score in q is minus the priority: the head is the highest priority,
// then the lowest ticket.
const queueHead = `
local function qhead(q, qt)
  local tm = redis.call('TIME')
  local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
  local dead = redis.call('ZRANGEBYSCORE', qt, '-inf', now, 'LIMIT', 0, 64)
  if #dead > 0 then
    redis.call('ZREM', q, unpack(dead))
    redis.call('ZREM', qt, unpack(dead))
  end
  local h = redis.call('ZRANGE', q, 0, 0, 'WITHSCORES')
  while h[1] do
    local exp = redis.call('ZSCORE', qt, h[1])
    if not exp or tonumber(exp) > now then
      return h[1], -tonumber(h[2]), math.max(tonumber(exp or now) - now, 1)
    end
    redis.call('ZREM', q, h[1])
    redis.call('ZREM', qt, h[1])
    h = redis.call('ZRANGE', q, 0, 0, 'WITHSCORES')
  end
  return nil
end
`

// Ticket is the source of redlockprio's ticketScript.
const Ticket = `
return redis.call('INCR', KEYS[1])
`

// Enqueue is the source of redlockprio's enqueueScript.
const Enqueue = `
local member, prio, life, ticket = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if tonumber(redis.call('GET', KEYS[3]) or '0') < ticket then redis.call('SET', KEYS[3], ticket) end
` + queueHead + `
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
redis.call('ZADD', KEYS[1], -prio, member)
redis.call('ZADD', KEYS[2], now + life, member)
local h, _, left = qhead(KEYS[1], KEYS[2])
if h == member and redis.call('EXISTS', KEYS[4]) == 0 then return {1, 0, 0} end
return {0, redis.call('ZRANK', KEYS[1], member), left}
`

// Dequeue is the source of redlockprio's dequeueScript.
const Dequeue = `
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if removed == 1 and redis.call('EXISTS', KEYS[3]) == 0 and redis.call('EXISTS', KEYS[1]) == 1 then
` + queueHead + `
  local h = qhead(KEYS[1], KEYS[2])
  local inbox = h and string.match(h, '^[^|]*|([^|]*)|')
  if inbox then redis.call('PUBLISH', inbox, 'W|' .. h) end
end
return removed
`
