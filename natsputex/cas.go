package natsputex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/locks/driver"
)

// This file holds the compare-and-set primitives on one key that both the
// Locker and the Supervisor are built on, and the takeover clock.

// record is what a read of a key found.
type record struct {
	rev    uint64    // revision of the last write (0 if the key never existed)
	holder string    // the token in the key, "" when free
	exists bool      // false when the key is missing or deleted
	at     time.Time // when the last write was stored, by the stream leader's clock
	// reserved: the key was left free for the head of its queue (see
	// queue.go): free, but a Lock that is not the head waits its turn.
	reserved bool
}

// free reports whether the key may be written at once: missing, deleted,
// blank or reserved.
func (r record) free() bool { return r.holder == "" }

// reservedValue is what a holder that was the head of the key's queue
// writes when it releases the key while others may be waiting: the key
// is free, but a Lock that is not the head of the queue goes to its back
// (see queue.go). No token can be this value: tokens are printable.
const reservedValue = "\x00queue"

// store runs the protocol's reads and writes on one bucket.
type store struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	nc     *nats.Conn
	get    string // the stream's message-get API subject
	api    string // the JetStream API prefix, "$JS.API."
	prefix string // the subject prefix of the bucket's keys
}

func newStore(js jetstream.JetStream, kv jetstream.KeyValue) store {
	o := js.Options()
	api := "$JS.API."
	switch {
	case o.Domain != "":
		api = "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		api = strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return store{
		js:     js,
		kv:     kv,
		nc:     js.Conn(),
		get:    api + "STREAM.MSG.GET.KV_" + kv.Bucket(),
		api:    api,
		prefix: "$KV." + kv.Bucket() + ".",
	}
}

// read returns the key's current record, as the stream's leader has it.
//
// It does not use [jetstream.KeyValue.Get]: KV buckets allow direct gets,
// which any replica may answer, possibly before it has the latest write,
// so a client could see a key it just saw released as still held. A stale
// read would never break safety (every write is conditional) but it would
// make TryLock fail on a free key.
func (s store) read(ctx context.Context, key string) (record, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	req, _ := json.Marshal(struct {
		LastBySubj string `json:"last_by_subj"`
	}{s.prefix + key})
	m, _, err := resend(ctx, func() (*nats.Msg, error) { return s.nc.RequestWithContext(ctx, s.get, req) })
	if err != nil {
		return record{}, err
	}
	return decodeRecord(key, m.Data)
}

// decodeRecord decodes JetStream's answer to a message get of key: any
// bytes at all, from a broker or a stranger, give a record or an error.
func decodeRecord(key string, data []byte) (record, error) {
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Seq  uint64    `json:"seq"`
			Hdrs []byte    `json:"hdrs"`
			Data []byte    `json:"data"`
			Time time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(data, &resp); err != nil {
		return record{}, fmt.Errorf("reading key %q: bad answer: %w", key, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == jsNoMessageFound:
		return record{}, nil
	case resp.Error != nil:
		// As an *jetstream.APIError, so that errors.Is matches
		// jetstream.ErrStreamNotFound and the like.
		return record{}, fmt.Errorf("reading key %q: %w", key, &jetstream.APIError{
			Code: resp.Error.Code, ErrorCode: jetstream.ErrorCode(resp.Error.ErrCode), Description: resp.Error.Description})
	case resp.Message == nil:
		return record{}, fmt.Errorf("reading key %q: empty answer", key)
	case resp.Message.Seq == 0:
		return record{}, fmt.Errorf("reading key %q: a message without a sequence", key)
	}
	r := record{rev: resp.Message.Seq, holder: string(resp.Message.Data), exists: true, at: resp.Message.Time}
	if r.holder == reservedValue {
		r.holder, r.reserved = "", true
	}
	if len(resp.Message.Hdrs) > 0 {
		h, err := decodeHeaders(resp.Message.Hdrs)
		if err != nil {
			return record{}, fmt.Errorf("reading key %q: %w", key, err)
		}
		if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			// A deleted key: free, and written over by a create.
			return record{rev: r.rev, at: r.at}, nil
		}
	}
	return r, nil
}

// decodeHeaders is nats.DecodeHeadersMsg, which panics on some malformed
// headers (nats.go v1.53: a slice out of range, found by FuzzDecodeRecord),
// with the panic turned into an error.
func decodeHeaders(b []byte) (h nats.Header, err error) {
	defer func() {
		if p := recover(); p != nil {
			h, err = nil, fmt.Errorf("malformed message headers: %v", p)
		}
	}()
	return nats.DecodeHeadersMsg(b)
}

// clockKey is the key of the bucket that [store.now] writes: its ':' is
// legal in a NATS subject but not in a lock's name, so that no lock is
// ever named so.
const clockKey = "natsputex:clock"

// now returns the server's time: the time the stream's leader stamps on
// a write made now, to the bucket's clock key (an empty message, one
// round trip), read back by its sequence (another). Compared with a
// record's at, it tells how long ago the key was last written without
// comparing the clocks of the client and the server.
func (s store) now(ctx context.Context) (time.Time, error) {
	ack, err := s.js.Publish(ctx, s.prefix+clockKey, nil)
	if err != nil {
		return time.Time{}, fmt.Errorf("writing the clock key: %w", err)
	}
	req, _ := json.Marshal(struct {
		Seq uint64 `json:"seq"`
	}{ack.Sequence})
	m, err := s.nc.RequestWithContext(ctx, s.get, req)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading the clock key: %w", err)
	}
	r, err := decodeRecord(clockKey, m.Data)
	switch {
	case err != nil:
		return time.Time{}, err
	case r.at.IsZero():
		return time.Time{}, errors.New("reading the clock key: no time")
	}
	return r.at, nil
}

// jsNoMessageFound is JetStream's error code for a message get that finds
// nothing.
const jsNoMessageFound = 10037

// claim writes token over what r describes, only if the key has not been
// written since: create when it does not exist, update at r.rev when it
// does. A conflict gives an error for which isConflict is true. It also
// returns when the write that was answered was sent (see [resend]): a
// lease's validity counts from it.
func (s store) claim(ctx context.Context, key, token string, r record) (uint64, time.Time, error) {
	return retryBusy(ctx, func() (uint64, error) {
		if !r.exists {
			// Create also handles a deleted key, re-reading its delete marker.
			return s.kv.Create(ctx, key, []byte(token))
		}
		return s.kv.Update(ctx, key, []byte(token), r.rev)
	})
}

// renew rewrites token at rev, the revision of the holder's last write,
// and returns the new revision and when the write that was answered was
// sent, as claim does.
func (s store) renew(ctx context.Context, key, token string, rev uint64) (uint64, time.Time, error) {
	return retryBusy(ctx, func() (uint64, error) { return s.kv.Update(ctx, key, []byte(token), rev) })
}

// clear blanks the key (writes blank, empty or [reservedValue]) if it
// still holds token: first at rev (the holder's
// last write), then, if another write intervened (a renewal whose answer
// was lost), at the revision of a fresh read when that read still shows
// token. It returns the blank's revision and the one it was written
// over, or 0s when the key was no longer the holder's: a stale clear
// never frees a successor.
func (s store) clear(ctx context.Context, key, token string, rev uint64, blank []byte) (nrev, over uint64, err error) {
	for range 3 {
		nrev, _, err := retryBusy(ctx, func() (uint64, error) { return s.kv.Update(ctx, key, blank, rev) })
		if err == nil {
			return nrev, rev, nil
		}
		if !isConflict(err) {
			return 0, 0, err
		}
		r, err := s.read(ctx, key)
		if err != nil {
			return 0, 0, err
		}
		if r.holder != token {
			return 0, 0, nil
		}
		rev = r.rev
	}
	return 0, 0, fmt.Errorf("key %q keeps changing under its holder", key)
}

// isConflict reports whether err is JetStream refusing a write because the
// key's last revision was not the one expected: the key was written by
// someone else. Single-node streams report code 10071, replicated ones
// 10164; nats.go maps them to ErrKeyExists or ErrKeyRevisionMismatch
// depending on the call.
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// retryBusy runs the write cas (through [resend]), and again after a
// short pause, up to 4 more times, while a replicated stream answers that
// another write of the key is still being replicated (code 10164): that
// write may be a real rival, which the next attempt then meets as a plain
// conflict (10071), or the previous write of the same holder whose
// bookkeeping lags its acknowledgement. It returns when the attempt that
// was answered was sent.
func retryBusy(ctx context.Context, cas func() (uint64, error)) (uint64, time.Time, error) {
	pause := time.Millisecond
	for attempt := 0; ; attempt++ {
		rev, sent, err := resend(ctx, cas)
		var apiErr *jetstream.APIError
		if err == nil || attempt == 4 || !errors.As(err, &apiErr) ||
			apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant {
			return rev, sent, err
		}
		if driver.Sleep(ctx, pause) != nil {
			return rev, sent, err
		}
		pause *= 3
	}
}

// resend runs req, a request to JetStream, and runs it again every
// unsentPause, until ctx ends, while nats.go refuses to send it because
// it reconnects ([nats.ErrReconnectBufExceeded]: [ConnectOptions]
// buffers nothing meanwhile). Such a request never left this process, so
// sending it once the connection is back is the same request, not a
// second one: a write is still the one conditional write. It returns
// req's answer and when the attempt that was sent began. Without it, a
// server restarted in milliseconds ended every lease whose renewal fell in
// nats.go's reconnect wait, and failed every Lock waiting then.
func resend[T any](ctx context.Context, req func() (T, error)) (T, time.Time, error) {
	for {
		sent := time.Now()
		v, err := req()
		if !errors.Is(err, nats.ErrReconnectBufExceeded) || driver.Sleep(ctx, unsentPause) != nil {
			return v, sent, natsOnce(err)
		}
	}
}

// natsError is an error of nats.go whose text says "nats: " once where
// nats.go says it twice (it wraps a JetStream API error, "nats: API
// error ...", in "nats: %w"); it unwraps to the error itself.
type natsError struct{ err error }

func (e natsError) Error() string { return strings.ReplaceAll(e.err.Error(), "nats: nats: ", "nats: ") }
func (e natsError) Unwrap() error { return e.err }

// natsOnce returns err, as a natsError if its text doubles "nats: ".
func natsOnce(err error) error {
	if err == nil || !strings.Contains(err.Error(), "nats: nats: ") {
		return err
	}
	return natsError{err}
}

// unsentPause is how long a request that nats.go refused to send while it
// reconnects waits before it is sent again: a tenth of ConnectOptions'
// shortest reconnect wait.
const unsentPause = 10 * time.Millisecond

// silence is the takeover clock of one key, kept by a waiter on its own
// monotonic clock: the last revision it saw and when it first saw it.
// Clocks of other machines are never consulted.
type silence struct {
	rev      uint64
	at       time.Time // the server's time of the write at rev, if known
	since    time.Time
	blank    bool // the write at rev, seen by the watch, left the key blank
	measured bool // the server's clock has told the write's age (backdate)
	// reborn is when the key was last seen to vanish (a missing key where
	// a revision was seen) or to go back to a lower revision written
	// later (the bucket deleted and made again, a memory bucket lost,
	// the stream purged, messages aged out): a holder of the key's past
	// may still believe it holds it, so a free key counts as held until
	// T after (see rebornHold).
	reborn time.Time
	held   timing // the longest T and C·R holders' values read by this call carried
	// told is a revision above rev at which the key's releasing holder
	// said it left the key free (see clocks.seeFreed); 0 if none.
	told uint64
}

// see records that rev, stored at at by the server's clock (zero when
// unknown or when the key is missing), was observed now. Any change of
// revision restarts the clock, a lower one too: a late delivery of an
// older write (by a watch behind a read) only delays a takeover, while a
// lower revision may also be a write to a bucket made again, whose
// revisions restart from 1. A lower revision that is a missing key, or
// whose write is not known to be older than the one seen, marks the key
// reborn.
func (s *silence) see(rev uint64, at, now time.Time) {
	if !s.since.IsZero() && rev == s.rev {
		return
	}
	if !s.since.IsZero() && rev < s.rev && (rev == 0 || at.IsZero() || s.at.IsZero() || at.After(s.at)) {
		s.reborn = now
	}
	s.rev, s.at, s.since, s.blank, s.measured = rev, at, now, false, false
}

// quiet returns how long the key has been seen unchanged at rev, or 0 if
// rev is not the revision the clock runs for.
func (s *silence) quiet(rev uint64, now time.Time) time.Duration {
	if s.since.IsZero() || rev != s.rev {
		return 0
	}
	return now.Sub(s.since)
}

// rebornHold reports whether the key was seen reborn (see silence) less
// than T, or the longest T a holder's value carried, ago.
func (s *silence) rebornHold(T time.Duration, now time.Time) bool {
	return !s.reborn.IsZero() && now.Sub(s.reborn) < max(T, s.held.ttl)
}

// clocks are the takeover clocks of one waiting call, one per key, shared
// between the call and its watch. It is safe for concurrent use.
type clocks struct {
	mu sync.Mutex
	s  []silence
}

func newClocks(n int) *clocks { return &clocks{s: make([]silence, n)} }

// see records rev, stored at at, on key i and returns how long it has
// been quiet since.
func (c *clocks) see(i int, rev uint64, at time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.s[i].see(rev, at, now)
	return c.s[i].quiet(rev, now)
}

// noteTiming records that a holder's value read on key i carried t.
func (c *clocks) noteTiming(i int, t timing) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := &c.s[i].held
	h.ttl, h.confirm = max(h.ttl, t.ttl), max(h.confirm, t.confirm)
}

// rebornHold reports whether key i was seen to vanish, or its revision
// to go back, less than T (or the longest T a holder's value carried)
// ago: a free key then counts as held, and is taken only after T of
// silence.
func (c *clocks) rebornHold(i int, T time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s[i].rebornHold(T, time.Now())
}

// longest returns the longest T and C·R holders' values read on key i
// carried.
func (c *clocks) longest(i int) timing {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s[i].held
}

// measured reports whether the age of the write at rev on key i has been
// measured with the server's clock ([clocks.backdate]) by this call.
func (c *clocks) measured(i int, rev uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s[i].rev == rev && c.s[i].measured
}

// backdate records that the write at rev on key i was age old, by the
// server's clock, now: the key's silence is counted from then if that is
// earlier than when this call first saw it. From then on only the rate of
// this call's own clock counts. It returns how long the key has been
// quiet.
func (c *clocks) backdate(i int, rev uint64, age time.Duration) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	s := &c.s[i]
	if s.rev == rev {
		s.measured = true
		if from := now.Add(-age); age > 0 && from.Before(s.since) {
			s.since = from
		}
	}
	return s.quiet(rev, now)
}

// seeBlank records that the watch saw key i left blank by the write at
// rev, stored at at.
func (c *clocks) seeBlank(i int, rev uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sl := &c.s[i]
	prev, seen, reborn := sl.rev, !sl.since.IsZero(), sl.reborn
	sl.see(rev, at, time.Now())
	// A blank older than a write already seen (a watch behind a read) is
	// no blank; one in a bucket made again is, once T has passed.
	if !seen || rev >= prev || !sl.reborn.Equal(reborn) {
		sl.blank = true
	}
}

// takeBlank returns the revision at which key i was last seen left blank,
// if no other write has been seen since, or the one a release was told
// at ([clocks.seeFreed]), if the key is not held as reborn (see
// rebornHold, for T), and forgets it: one attempt may write over that
// blank without reading the key first.
func (c *clocks) takeBlank(i int, T time.Duration) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.s[i]
	rev, ok := s.rev, s.blank
	if s.told > s.rev {
		rev, ok = s.told, true
	}
	s.blank, s.told = false, 0
	if !ok || s.rebornHold(T, time.Now()) {
		return 0, false
	}
	return rev, true
}

// seeFreed records that key i was left free by the write at rev, as
// the head of the key's queue was told by the holder that made it (see
// [Client.tellFreed]), if rev is above every revision this call has seen:
// the next attempt writes over it without reading the key first
// ([clocks.takeBlank]). The takeover clock is left alone: the attempt
// that does not win reads the key, which restarts it. It reports
// whether it took rev.
func (c *clocks) seeFreed(i int, rev uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.s[i]
	if rev <= s.rev || rev <= s.told {
		return false
	}
	s.told = rev
	return true
}

// last returns the last revision seen on key i and how long ago it was
// first seen.
func (c *clocks) last(i int) (uint64, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s[i].rev, c.s[i].quiet(c.s[i].rev, time.Now())
}
