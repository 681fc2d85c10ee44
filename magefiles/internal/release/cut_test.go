package release

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// gitRepo makes ws.Root a git repository with one commit, tagged as
// release v0.1.0 of every released module.
func gitRepo(t *testing.T, ws *Workspace) Git {
	t.Helper()
	g := Git{Dir: ws.Root}
	ctx := context.Background()
	for _, args := range [][]string{
		{"init", "-q"},
		{"config", "user.name", "release test"},
		{"config", "user.email", "release-test@example.test"},
		{"add", "-A"},
		{"commit", "-q", "-m", "v0.1.0"},
		{"tag", "locks/v0.1.0"},
		{"tag", "contracttest/v0.1.0"},
		{"tag", "backend/v0.1.0"},
	} {
		if _, err := g.Run(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// TestCut makes release v0.2.0 of the fake tree: one commit with the
// sibling requirements at v0.2.0 (unreleased modules' too) and the
// CHANGELOG entry, then one tag per released module, in dependency order.
func TestCut(t *testing.T) {
	ctx := context.Background()
	ws := fakeWorkspace(t, nil)
	g := gitRepo(t, ws)
	tags, err := g.Tags(ctx)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := NewPlan(ws, "v0.2.0", tags)
	if err != nil {
		t.Fatal(err)
	}
	if got := plan.Previous["backend"]; got != "v0.1.0" {
		t.Errorf("backend's previous version = %q, want v0.1.0", got)
	}
	date := time.Date(2026, 5, 4, 0, 0, 0, 0, time.UTC)
	made, err := Cut(ctx, ws, plan, "CHANGELOG.md", date)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(made, " "), "locks/v0.2.0 contracttest/v0.2.0 backend/v0.2.0"; got != want {
		t.Errorf("tags made = %s, want %s", got, want)
	}
	if err := g.CleanTree(ctx); err != nil {
		t.Errorf("after Cut: %v", err)
	}
	for _, tag := range made {
		out, err := g.Run(ctx, "rev-parse", tag+"^{commit}")
		head, err2 := g.Run(ctx, "rev-parse", "HEAD")
		if err != nil || err2 != nil || out != head {
			t.Errorf("tag %s is not on the release commit (%v, %v)", tag, err, err2)
		}
	}
	for file, want := range map[string]string{
		"backend/go.mod":      "example.test/kit/locks v0.2.0",
		"contracttest/go.mod": "example.test/kit/locks v0.2.0",
		"bench/go.mod":        "example.test/kit/backend v0.2.0",
		"CHANGELOG.md":        "## [Unreleased]\n\n## [v0.2.0] - 2026-05-04\n\n### Changed\n- backend: Hello names the client.\n",
	} {
		data, err := os.ReadFile(filepath.Join(ws.Root, file))
		if err != nil || !strings.Contains(string(data), want) {
			t.Errorf("%s after Cut lacks %q:\n%s", file, want, data)
		}
	}
	msg, _ := g.Run(ctx, "log", "-1", "--format=%B")
	if !strings.HasPrefix(msg, "release v0.2.0") {
		t.Errorf("release commit message = %q", msg)
	}
}

// TestCutRefusesAReplace: a released go.mod with a replace stops the
// release before anything is written or committed.
func TestCutRefusesAReplace(t *testing.T) {
	ctx := context.Background()
	ws := fakeWorkspace(t, map[string]string{
		"backend/go.mod": fakeFiles["backend/go.mod"] + "\nreplace example.test/kit/locks => ../locks\n",
	})
	g := gitRepo(t, ws)
	tags, _ := g.Tags(ctx)
	plan, err := NewPlan(ws, "v0.2.0", tags)
	if err != nil {
		t.Fatal(err)
	}
	made, err := Cut(ctx, ws, plan, "CHANGELOG.md", time.Now())
	var pe *ProblemsError
	if !errors.As(err, &pe) || !hasProblem(pe.Problems, "backend: go.mod has replace example.test/kit/locks => ../locks") {
		t.Errorf("Cut with a replace = %v, want an error naming it", err)
	}
	if len(made) != 0 {
		t.Errorf("Cut with a replace made tags %v", made)
	}
	if err := g.CleanTree(ctx); err != nil {
		t.Errorf("Cut that failed its check changed the tree: %v", err)
	}
}

func TestNewPlanRefuses(t *testing.T) {
	ws := fakeWorkspace(t, nil)
	tags := []string{"locks/v0.1.0", "backend/v0.1.0", "backend/v0.3.0", "contracttest/v0.2.0", "contracttest/testenv/v0.9.0"}
	for version, want := range map[string]string{
		"0.2.0":        "not a version like v0.2.0",
		"v0.2":         "not a version like v0.2.0",
		"v0.4.0+build": "not a version like v0.2.0",
		"v2.0.0":       "module paths ending in /v2",
		"v0.2.0":       "tag contracttest/v0.2.0 exists; v0.2.0 is not above backend's latest tag backend/v0.3.0",
	} {
		_, err := NewPlan(ws, version, tags)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NewPlan(%q) = %v, want an error with %q", version, err, want)
		}
	}
	plan, err := NewPlan(ws, "v0.4.0", tags)
	if err != nil {
		t.Fatal(err)
	}
	if got := plan.Previous["contracttest"]; got != "v0.2.0" {
		t.Errorf("contracttest's previous version = %q, want v0.2.0 (not contracttest/testenv's tag)", got)
	}
}

func TestAddRelease(t *testing.T) {
	date := time.Date(2026, 5, 4, 0, 0, 0, 0, time.UTC)
	in := "# Changelog\n\nIntro.\n\n## [Unreleased]\n\n### Changed\n- a\n\n## [v0.1.0] - 2026-01-01\n\n- first\n"
	want := "# Changelog\n\nIntro.\n\n## [Unreleased]\n\n## [v0.2.0] - 2026-05-04\n\n### Changed\n- a\n\n## [v0.1.0] - 2026-01-01\n\n- first\n"
	got, err := AddRelease(in, "v0.2.0", date)
	if err != nil || got != want {
		t.Errorf("AddRelease = %v\n%s\nwant\n%s", err, got, want)
	}
	for name, bad := range map[string]string{
		"no Unreleased section":             "# Changelog\n\n## [v0.1.0] - 2026-01-01\n",
		"the Unreleased section is empty":   "# Changelog\n\n## [Unreleased]\n\n## [v0.1.0] - 2026-01-01\n",
		"a section for v0.1.0 exists":       "# Changelog\n\n## [Unreleased]\n- a\n\n## [v0.1.0] - 2026-01-01\n",
		"the Unreleased section is empty: ": "# Changelog\n\n## [Unreleased]\n\n[Unreleased]: https://example.test\n",
	} {
		version := "v0.2.0"
		if strings.Contains(name, "v0.1.0") {
			version = "v0.1.0"
		}
		if _, err := AddRelease(bad, version, date); err == nil || !strings.Contains(err.Error(), strings.TrimSuffix(name, ": ")) {
			t.Errorf("AddRelease(%q) = %v, want an error with %q", bad, err, name)
		}
	}
}

func TestBumpWork(t *testing.T) {
	ws := &Workspace{Modules: []*Module{
		{Dir: "locks", Path: "github.com/latchkey-go/latchkey/locks", Role: Role{Kind: Library}},
		{Dir: "natsputex/tests", Path: "github.com/latchkey-go/latchkey/natsputex/tests", Role: Role{Kind: Unreleased}},
	}}
	in := []byte("go 1.26.0\n\nuse (\n\t./locks\n\t./natsputex/tests\n)\n\nreplace github.com/latchkey-go/latchkey/locks v0.1.0 => ./locks\n")
	out, changed, err := BumpWork(ws, in, "v0.2.0")
	if err != nil || !changed {
		t.Fatalf("BumpWork: changed %v, %v", changed, err)
	}
	if !strings.Contains(string(out), "github.com/latchkey-go/latchkey/locks v0.2.0 => ./locks") || strings.Contains(string(out), "v0.1.0") {
		t.Fatalf("go.work after the bump:\n%s", out)
	}
	if _, changed, _ := BumpWork(ws, out, "v0.2.0"); changed {
		t.Fatal("a second bump to the same version changed go.work")
	}
}
