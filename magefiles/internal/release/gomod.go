package release

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
)

// A Problem is one reason a release would not work for its users.
type Problem struct {
	Module string // the directory of the module at fault, or "<dir> consumer"
	Msg    string // what is wrong, naming the requirement at fault
	Fix    string // how to fix it; problems of one kind share it
}

func (p Problem) String() string { return p.Module + ": " + p.Msg }

// How to fix each kind of problem.
const (
	fixReplace  = "drop the replace lines from released go.mod files: go.work wires the local copies, and Go ignores a dependency's replace anyway"
	fixFake     = "require siblings at a released version (release sets them): v0.0.0 and v0.0.0-00010101000000-000000000000 resolve only through a replace"
	fixTestOnly = "move the tests that need test-only modules (contracttest, testenv, dockertest, embedded servers, goleak...) into a module of their own, then go mod tidy"
	fixClient   = "a backend requires only its own broker's client (its Role.Client in the release policy)"
	fixSibling  = "a released module requires only released siblings (see the release policy's roles)"
	fixVersions = "released modules move together: require every sibling at the one release version"
	fixLean     = "a library's go.mod lists only locks, its broker's client and what that needs; a module it really needs goes in its Role.Allow"
	fixPath     = "a module in directory d must have the path <root>/d for its tags d/vX.Y.Z to work"
)

// ProblemsError is the error of a check that found problems.
type ProblemsError struct {
	What     string
	Problems []Problem
}

// Error lists the problems grouped by module, then how to fix each kind.
func (e *ProblemsError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d problem(s)", e.What, len(e.Problems))
	var fixes []string
	last := ""
	for _, p := range e.Problems {
		if p.Module != last {
			fmt.Fprintf(&b, "\n%s:", p.Module)
			last = p.Module
		}
		b.WriteString("\n  " + p.Msg)
		if p.Fix != "" && !slices.Contains(fixes, p.Fix) {
			fixes = append(fixes, p.Fix)
		}
	}
	if len(fixes) > 0 {
		b.WriteString("\nto fix:")
		for _, f := range fixes {
			b.WriteString("\n  - " + f)
		}
	}
	return b.String()
}

// AsError returns nil for no problems, else a *ProblemsError with the
// problems sorted by module, keeping their order within a module.
func AsError(what string, problems []Problem) error {
	if len(problems) == 0 {
		return nil
	}
	sorted := slices.Clone(problems)
	slices.SortStableFunc(sorted, func(a, b Problem) int { return strings.Compare(a.Module, b.Module) })
	return &ProblemsError{What: what, Problems: sorted}
}

// IsFakeVersion reports whether v is a version no one can download: v0.0.0,
// or a pseudo-version of the zero time or the zero revision, which the go
// command writes for a requirement satisfied only by a replace
// (v0.0.0-00010101000000-000000000000).
func IsFakeVersion(v string) bool {
	if v == "v0.0.0" {
		return true
	}
	if !module.IsPseudoVersion(v) {
		return false
	}
	t, err := module.PseudoVersionTime(v)
	if err == nil && t.Year() <= 1 {
		return true
	}
	rev, err := module.PseudoVersionRev(v)
	return err == nil && strings.Trim(rev, "0") == ""
}

// CheckGoMods checks the go.mod of every released module: the module path
// its tags need, no replace, no fake version, sibling requirements only on
// released modules and all at one version; and, for a library, no
// test-only module, no support module and no other broker's client, direct
// or indirect. It returns every problem found.
func CheckGoMods(ws *Workspace) []Problem {
	var problems []Problem
	for _, m := range ws.Released() {
		problems = append(problems, checkGoMod(ws, m)...)
	}
	return append(problems, checkSiblingVersions(ws)...)
}

func checkGoMod(ws *Workspace, m *Module) []Problem {
	p := ws.Policy
	var out []Problem
	add := func(fix, format string, args ...any) {
		out = append(out, Problem{Module: m.Dir, Msg: fmt.Sprintf(format, args...), Fix: fix})
	}
	if want := modulePathFor(p.RootPath, m.Dir); m.Path != want {
		add(fixPath, "module path %s: its tags %s/vX.Y.Z need the path %s", m.Path, m.Dir, want)
	}
	for _, r := range m.File.Replace {
		add(fixReplace, "go.mod has replace %s => %s", describe(r.Old), describe(r.New))
	}
	for _, r := range m.File.Require {
		req := describeReq(r)
		if IsFakeVersion(r.Mod.Version) {
			add(fixFake, "go.mod requires %s: a fake version no one can download", req)
		}
		if p.isSibling(r.Mod.Path) {
			checkSiblingReq(ws, m, r, add)
			continue
		}
		if m.Role.Kind != Library {
			continue
		}
		switch {
		case p.testOnly(r.Mod.Path):
			add(fixTestOnly, "go.mod requires %s: a test-only module", req)
		case p.otherClient(r.Mod.Path, m.Role.Client):
			add(fixClient, "go.mod requires %s: another broker's client (%s)", req, clientNote(m))
		}
	}
	return out
}

// checkSiblingReq checks m's requirement r on another module of this
// repository.
func checkSiblingReq(ws *Workspace, m *Module, r *modfile.Require, add func(string, string, ...any)) {
	s := ws.Module(r.Mod.Path)
	req := describeReq(r)
	switch {
	case s == nil:
		add(fixSibling, "go.mod requires %s: not a go.work module", req)
	case s.Role.Kind == Unreleased:
		add(fixSibling, "go.mod requires %s: never released (%s)", req, s.Role.Why)
	case m.Role.Kind == Library && s.Role.Kind == Support:
		add(fixTestOnly, "go.mod requires %s: a support module for tests", req)
	case m.Role.Kind == Library && s.Role.Client != "" && s.Role.Client != m.Role.Client:
		add(fixClient, "go.mod requires %s: another backend (with %s)", req, s.Role.Client)
	}
}

// checkSiblingVersions reports released modules that require their
// siblings at different versions: they move together.
func checkSiblingVersions(ws *Workspace) []Problem {
	users := map[string][]string{} // version -> "dir requires sibling"
	for _, m := range ws.Released() {
		for _, r := range m.File.Require {
			if ws.Policy.isSibling(r.Mod.Path) && !IsFakeVersion(r.Mod.Version) {
				users[r.Mod.Version] = append(users[r.Mod.Version], m.Dir+" requires "+ws.Policy.short(r.Mod.Path))
			}
		}
	}
	if len(users) < 2 {
		return nil
	}
	var parts []string
	for _, v := range sortedKeys(users) {
		parts = append(parts, v+" ("+strings.Join(users[v], ", ")+")")
	}
	return []Problem{{Module: "(all)", Msg: "sibling requirements name different versions: " + strings.Join(parts, "; "), Fix: fixVersions}}
}

// modulePathFor returns the module path a module in dir must have.
func modulePathFor(rootPath, dir string) string {
	if dir == "." {
		return rootPath
	}
	return rootPath + "/" + dir
}

func describeReq(r *modfile.Require) string {
	s := r.Mod.Path + " " + r.Mod.Version
	if r.Indirect {
		s += " (indirect)"
	}
	return s
}

func describe(v module.Version) string {
	if v.Version == "" {
		return v.Path
	}
	return v.Path + " " + v.Version
}

// clientNote says which broker client m may have.
func clientNote(m *Module) string {
	if m.Role.Client == "" {
		return m.Dir + " may have none"
	}
	return m.Dir + " may have only " + m.Role.Client
}

// PinSiblings returns m's go.mod with every requirement on a released
// sibling set to version, and whether anything changed.
func PinSiblings(ws *Workspace, m *Module, version string) ([]byte, bool, error) {
	f, err := modfile.Parse(m.Dir+"/go.mod", m.GoMod, nil)
	if err != nil {
		return nil, false, err
	}
	changed := false
	for _, r := range slices.Clone(f.Require) {
		s := ws.Module(r.Mod.Path)
		if s == nil || s.Role.Kind == Unreleased || r.Mod.Version == version {
			continue
		}
		if err := f.AddRequire(r.Mod.Path, version); err != nil {
			return nil, false, err
		}
		changed = true
	}
	if !changed {
		return m.GoMod, false, nil
	}
	f.Cleanup()
	data, err := f.Format()
	return data, true, err
}

// BumpWork returns go.work with every versioned replace of a released
// module (the local copy standing in for a version not tagged yet) moved
// to version, and whether it changed.
func BumpWork(ws *Workspace, data []byte, version string) ([]byte, bool, error) {
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, false, err
	}
	changed := false
	for _, r := range append([]*modfile.Replace(nil), wf.Replace...) {
		m := ws.Module(r.Old.Path)
		if m == nil || m.Role.Kind == Unreleased || r.Old.Version == "" || r.Old.Version == version {
			continue
		}
		oldPath, oldVersion, newPath, newVersion := r.Old.Path, r.Old.Version, r.New.Path, r.New.Version
		if err := wf.DropReplace(oldPath, oldVersion); err != nil {
			return nil, false, err
		}
		if err := wf.AddReplace(oldPath, version, newPath, newVersion); err != nil {
			return nil, false, err
		}
		changed = true
	}
	if !changed {
		return data, false, nil
	}
	wf.Cleanup()
	return modfile.Format(wf.Syntax), true, nil
}
