package driver

import (
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/latchkey-go/latchkey/locks"
)

// NameRule says which names a broker accepts. The zero NameRule accepts any
// non-empty valid UTF-8 name without control characters.
type NameRule struct {
	What   string          // what a name becomes at the broker, for errors: "NATS KV key"
	MaxLen int             // in bytes; 0 means no limit
	Char   func(rune) bool // which characters are allowed; nil allows all but control characters
	Extra  func(string) error
}

// Check returns nil if name is legal under r, else an error matching
// [locks.ErrInvalidName] that says why. It does no I/O.
func (r NameRule) Check(name string) error {
	what := r.What
	if what == "" {
		what = "name"
	}
	bad := func(why string, args ...any) error {
		return fmt.Errorf("%w %s: %s %s", locks.ErrInvalidName, ShownName(name), what, fmt.Sprintf(why, args...))
	}
	switch {
	case name == "":
		return bad("must not be empty")
	case !utf8.ValidString(name):
		return bad("must be valid UTF-8")
	case r.MaxLen > 0 && len(name) > r.MaxLen:
		return bad("is %d bytes long, longer than %d", len(name), r.MaxLen)
	}
	for i, c := range name {
		if r.Char != nil && !r.Char(c) || r.Char == nil && unicode.IsControl(c) {
			return bad("must not contain %q (byte %d)", c, i)
		}
	}
	if r.Extra != nil {
		if err := r.Extra(name); err != nil {
			return fmt.Errorf("%w %s: %w", locks.ErrInvalidName, ShownName(name), err)
		}
	}
	return nil
}

// Positive returns an error matching [locks.ErrInvalidOption] unless d > 0.
// what names the option in the message.
func Positive(what string, d time.Duration) error {
	if d <= 0 {
		return InvalidOption("%s must be > 0, got %v", what, d)
	}
	return nil
}

// Fraction returns an error matching [locks.ErrInvalidOption] unless 0 <= f < 1.
func Fraction(what string, f float64) error {
	if !(f >= 0 && f < 1) { // also rejects NaN
		return InvalidOption("%s must be in [0, 1), got %v", what, f)
	}
	return nil
}

// Apply runs each option on o and returns the first error, so a backend's
// constructor validates all its options before any I/O. nil options are
// skipped.
func Apply[O any, F ~func(*O) error](o *O, opts []F) error {
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(o); err != nil {
			return err
		}
	}
	return nil
}

// MaxHolderIDLen is the longest holder id [CheckHolderID] accepts, in
// bytes.
const MaxHolderIDLen = 200

// CheckHolderID is the one rule for the holder ids every backend's
// WithHolderID takes: 1 to [MaxHolderIDLen] bytes of valid UTF-8, every
// character printable ([unicode.IsPrint]: no control characters, no
// spaces other than U+0020), and none of '|', '{' and '}', which some
// brokers' key and value layouts reserve. It returns nil or an error
// matching [locks.ErrInvalidOption] that says why.
func CheckHolderID(id string) error {
	switch {
	case id == "":
		return InvalidOption("holder id must not be empty")
	case !utf8.ValidString(id):
		return InvalidOption("holder id %q must be valid UTF-8", id)
	case len(id) > MaxHolderIDLen:
		return InvalidOption("holder id is %d bytes long, longer than %d", len(id), MaxHolderIDLen)
	}
	for i, c := range id {
		if !unicode.IsPrint(c) || c == '|' || c == '{' || c == '}' {
			return InvalidOption("holder id %q must not contain %q (byte %d)", id, c, i)
		}
	}
	return nil
}
