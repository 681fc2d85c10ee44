package testenv

import (
	"os"
	"strings"
	"testing"
)

// RequireCI reports whether a missing broker must fail a test rather than skip
// it. It is true when the CI environment variable is set to anything other
// than "", "0" or "false" (in any case). It is safe to call from several
// goroutines.
func RequireCI() bool {
	v := strings.TrimSpace(os.Getenv("CI"))
	return v != "" && v != "0" && !strings.EqualFold(v, "false")
}

// Missing reports that the test cannot run because what is not available, and
// how says how to provide it. It calls t.Skip, or t.Fatal when [RequireCI]
// is true. Either way it stops the calling test, so it must be called from the
// goroutine running the test, like [testing.TB.FailNow].
func Missing(t testing.TB, what, how string) {
	t.Helper()
	missing(t.Skip, t.Fatal, what, how)
}

// missing is Missing with the two ways of stopping a test made injectable, so
// that the CI rule can be tested.
func missing(skip, fatal func(args ...any), what, how string) {
	msg := (&MissingError{What: what, How: how}).Error()
	if RequireCI() {
		fatal(msg + " (CI is set: a missing broker fails the run instead of skipping)")
		return
	}
	skip(msg + " (set CI=true to make this a failure)")
}
