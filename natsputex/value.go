package natsputex

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// This file holds what a key's value says: the holder's token and the
// timing it counts on (see the package doc, Protocol).

// timing is what a holder advertises of its own timing, so that a
// taker-over with shorter settings still waits as long as the holder
// counts on: T, after which another client may take the key, and C·R,
// the time a successor confirms (the holder's Stop counts on it).
type timing struct{ ttl, confirm time.Duration }

func (t timing) String() string { return fmt.Sprintf("T=%v C·R=%v", t.ttl, t.confirm) }

// longer returns the longer T and the longer C·R of t and u.
func (t timing) longer(u timing) timing {
	return timing{max(t.ttl, u.ttl), max(t.confirm, u.confirm)}
}

// parseTiming reads what timing.String wrote.
func parseTiming(v string) (timing, bool) {
	var ts, cs string
	if _, err := fmt.Sscanf(v, "T=%s C·R=%s", &ts, &cs); err != nil {
		return timing{}, false
	}
	t, err1 := time.ParseDuration(ts)
	c, err2 := time.ParseDuration(cs)
	if err1 != nil || err2 != nil || t <= 0 || c < 0 {
		return timing{}, false
	}
	return timing{t, c}, true
}

// valueOf returns what a holder with token and timing t writes in the
// key: its token, a newline (no token holds one: control characters are
// refused) and its timing, so that the timing a taker-over goes by is
// read with the holder, in the same write, and cannot be lost or
// overwritten apart from it. A Supervisor always writes it; a taker-over
// writes it while it confirms (see [confirmation]).
func valueOf(token string, t timing) string { return token + "\n" + t.String() }

// parseValue splits a key's value into the holder's token and the timing
// it carries: a Supervisor's value (see valueOf) carries T and C·R, a
// Locker's token its T only (see tokenTTL; confirm is then 0). ok is
// false when the value carries no timing: the token is then the whole
// value.
func parseValue(v string) (token string, t timing, ok bool) {
	if i := strings.IndexByte(v, '\n'); i >= 0 {
		if t, ok := parseTiming(v[i+1:]); ok {
			return v[:i], t, true
		}
		return v, timing{}, false
	}
	if d := tokenTTL(v); d > 0 {
		return v, timing{ttl: d}, true
	}
	return v, timing{}, false
}

// holderToken returns the token in a key's value (see parseValue).
func holderToken(v string) string {
	token, _, _ := parseValue(v)
	return token
}

// newToken returns a value unique to one lease: the holder id, 8 random
// bytes and the client's T, "id/0123456789abcdef/1.2s", so that a client
// with a shorter T does not take the key over from this one (see
// [tokenTTL]).
func (c *Client) newToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return c.o.holderID + "/" + hex.EncodeToString(b[:]) + "/" + c.o.ttl().String()
}

// tokenTTL returns the T a Locker's token (see newToken) carries, or 0 if
// token is not one (a Supervisor's token, a host name, carries none).
func tokenTTL(token string) time.Duration {
	i := strings.LastIndexByte(token, '/')
	if i < 17 || token[i-17] != '/' {
		return 0
	}
	if _, err := hex.DecodeString(token[i-16 : i]); err != nil {
		return 0
	}
	d, err := time.ParseDuration(token[i+1:])
	if err != nil || d <= 0 {
		return 0
	}
	return d
}
