package release

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

var (
	unreleasedHeading = regexp.MustCompile(`(?im)^## \[unreleased\][ \t]*$`)
	versionHeading    = regexp.MustCompile(`(?m)^## `)
	linkDefinitions   = regexp.MustCompile(`(?m)^\[[^\]]+\]: `)
)

// AddRelease returns changelog (Keep a Changelog style) with the body of
// its "## [Unreleased]" section moved under a new "## [version] - date"
// heading, and an empty Unreleased section left above it. It fails when
// there is no Unreleased section, when it is empty (a release says what
// changed), or when version already has a section.
func AddRelease(changelog, version string, date time.Time) (string, error) {
	loc := unreleasedHeading.FindStringIndex(changelog)
	if loc == nil {
		return "", errors.New("no Unreleased section (a \"## [Unreleased]\" heading)")
	}
	if strings.Contains(changelog, "## ["+version+"]") {
		return "", fmt.Errorf("a section for %s exists", version)
	}
	bodyStart := loc[1]
	bodyEnd := len(changelog)
	if next := versionHeading.FindStringIndex(changelog[bodyStart:]); next != nil {
		bodyEnd = bodyStart + next[0]
	} else if links := linkDefinitions.FindStringIndex(changelog[bodyStart:]); links != nil {
		bodyEnd = bodyStart + links[0]
	}
	body := strings.TrimSpace(changelog[bodyStart:bodyEnd])
	if body == "" {
		return "", errors.New("the Unreleased section is empty: say what changed before releasing")
	}
	var b strings.Builder
	b.WriteString(changelog[:loc[0]])
	b.WriteString("## [Unreleased]\n\n")
	fmt.Fprintf(&b, "## [%s] - %s\n\n", version, date.Format(time.DateOnly))
	b.WriteString(body)
	b.WriteString("\n")
	if rest := changelog[bodyEnd:]; rest != "" {
		b.WriteString("\n" + rest)
	}
	return b.String(), nil
}
