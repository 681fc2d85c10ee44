package release

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/semver"
)

// A Plan is one release: the version, the released modules in the order
// they are tagged, and each one's previous version.
type Plan struct {
	Version  string
	Order    []*Module
	Previous map[string]string // by directory: the highest earlier version tagged, "" for none
}

// NewPlan checks that version can be released given the repository's tags
// and orders the modules. version must be a canonical semantic version of
// major 0 or 1 (v2 needs new module paths), greater than every module's
// previous version, and not yet tagged for any module.
func NewPlan(ws *Workspace, version string, tags []string) (*Plan, error) {
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return nil, fmt.Errorf("release: %q is not a version like v0.2.0 (canonical semver, a leading v, no build metadata)", version)
	}
	if major := semver.Major(version); major != "v0" && major != "v1" {
		return nil, fmt.Errorf("release: %s: a major version above v1 needs module paths ending in /%s; this tooling does not do that", version, major)
	}
	order, err := ws.Order()
	if err != nil {
		return nil, err
	}
	p := &Plan{Version: version, Order: order, Previous: map[string]string{}}
	existing := map[string]bool{}
	for _, t := range tags {
		existing[t] = true
	}
	var errs []string
	for _, m := range order {
		if existing[m.Tag(version)] {
			errs = append(errs, fmt.Sprintf("tag %s exists", m.Tag(version)))
		}
		prev := PreviousVersion(tags, m.Dir, version)
		p.Previous[m.Dir] = prev
		if prev != "" && semver.Compare(version, prev) <= 0 {
			errs = append(errs, fmt.Sprintf("%s is not above %s's latest tag %s", version, m.Dir, m.Tag(prev)))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("release %s: %s", version, strings.Join(errs, "; "))
	}
	return p, nil
}

// PreviousVersion returns the highest version v other than version with a
// tag "dir/v" in tags, or "".
func PreviousVersion(tags []string, dir, version string) string {
	best := ""
	for _, t := range tags {
		v, ok := strings.CutPrefix(t, dir+"/")
		if !ok || !semver.IsValid(v) || v == version {
			continue
		}
		if best == "" || semver.Compare(v, best) > 0 {
			best = v
		}
	}
	return best
}

// Tags returns the tags the plan makes, in order.
func (p *Plan) Tags() []string {
	var tags []string
	for _, m := range p.Order {
		tags = append(tags, m.Tag(p.Version))
	}
	return tags
}

// Print writes the plan: each tag in order, with its module, role and
// previous version; then the modules that are not released.
func (p *Plan) Print(w io.Writer, ws *Workspace) {
	fmt.Fprintf(w, "release %s: %d module(s), tagged in dependency order:\n", p.Version, len(p.Order))
	for i, m := range p.Order {
		prev := p.Previous[m.Dir]
		if prev == "" {
			prev = "none"
		}
		fmt.Fprintf(w, "  %d. %-40s %s (%s; previous: %s)\n", i+1, m.Tag(p.Version), m.Path, m.Role.Kind, prev)
	}
	for _, m := range ws.Modules {
		if m.Role.Kind == Unreleased {
			fmt.Fprintf(w, "  not released: %s (%s)\n", m.Dir, m.Role.Why)
		}
	}
}

// BumpAll returns the new go.mod of every workspace module whose
// requirements on released siblings do not all name version yet.
func BumpAll(ws *Workspace, version string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, m := range ws.Modules {
		data, changed, err := PinSiblings(ws, m, version)
		if err != nil {
			return nil, fmt.Errorf("%s/go.mod: %w", m.Dir, err)
		}
		if changed {
			out[m.Dir] = data
		}
	}
	return out, nil
}

// Cut makes the release commit and tags in the git repository at ws.Root:
// every module's requirements on released siblings set to the plan's
// version (and go.work's replaces of them, which stand in for versions
// not tagged yet), the CHANGELOG's Unreleased section moved under the version
// (dated date), one commit, then one annotated tag per released module in
// dependency order. Before it writes anything it checks the new go.mod
// files ([CheckGoMods]) and the CHANGELOG; on such a failure the tree is
// left as it was. It returns the tags it made.
func Cut(ctx context.Context, ws *Workspace, p *Plan, changelog string, date time.Time) ([]string, error) {
	mods, err := BumpAll(ws, p.Version)
	if err != nil {
		return nil, err
	}
	bumped, err := ws.WithGoMods(mods)
	if err != nil {
		return nil, err
	}
	if err := AsError("release "+p.Version+": the go.mod files at "+p.Version, CheckGoMods(bumped)); err != nil {
		return nil, err
	}
	clPath := filepath.Join(ws.Root, changelog)
	cl, err := os.ReadFile(clPath)
	if err != nil {
		return nil, err
	}
	newCL, err := AddRelease(string(cl), p.Version, date)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", changelog, err)
	}
	files := []string{changelog}
	for _, dir := range sortedKeys(mods) {
		f := filepath.Join(dir, "go.mod")
		if err := os.WriteFile(filepath.Join(ws.Root, f), mods[dir], 0o644); err != nil {
			return nil, err
		}
		files = append(files, filepath.ToSlash(f))
	}
	if err := os.WriteFile(clPath, []byte(newCL), 0o644); err != nil {
		return nil, err
	}
	workPath := filepath.Join(ws.Root, "go.work")
	if work, err := os.ReadFile(workPath); err == nil {
		newWork, changed, err := BumpWork(ws, work, p.Version)
		if err != nil {
			return nil, fmt.Errorf("go.work: %w", err)
		}
		if changed {
			if err := os.WriteFile(workPath, newWork, 0o644); err != nil {
				return nil, err
			}
			files = append(files, "go.work")
		}
	}
	git := Git{Dir: ws.Root}
	msg := fmt.Sprintf("release %s\n\nTags: %s\n", p.Version, strings.Join(p.Tags(), " "))
	if _, err := git.Run(ctx, append([]string{"add", "--"}, files...)...); err != nil {
		return nil, err
	}
	if _, err := git.Run(ctx, "commit", "-q", "-m", msg); err != nil {
		return nil, fmt.Errorf("%w (the go.mod and %s changes are in the tree; `git checkout -- .` undoes them)", err, changelog)
	}
	var made []string
	for _, m := range p.Order {
		tag := m.Tag(p.Version)
		if _, err := git.Run(ctx, "tag", "-a", tag, "-m", m.Path+" "+p.Version); err != nil {
			return made, err
		}
		made = append(made, tag)
	}
	return made, nil
}

// Git runs git in one repository.
type Git struct{ Dir string }

// Run runs git with args and returns its stdout; on failure the error
// holds what git printed.
func (g Git) Run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = g.Dir
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("git %s: %w\n%s", strings.Join(args, " "), err, indent(stderr.String()))
	}
	return stdout.String(), nil
}

// CleanTree fails when the work tree has changes or untracked files.
func (g Git) CleanTree(ctx context.Context) error {
	out, err := g.Run(ctx, "status", "--porcelain")
	if err != nil {
		return err
	}
	if strings.TrimSpace(out) != "" {
		return fmt.Errorf("the tree is not clean (commit or stash first):\n%s", indent(out))
	}
	return nil
}

// Tags lists the repository's tags.
func (g Git) Tags(ctx context.Context) ([]string, error) {
	out, err := g.Run(ctx, "tag", "--list")
	return strings.Fields(out), err
}
