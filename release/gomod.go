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
	Module string // the directory of the module at fault, or of the consumer
	Msg    string
}

func (p Problem) String() string { return p.Module + ": " + p.Msg }

// ProblemsError is the error of a check that found problems.
type ProblemsError struct {
	What     string
	Problems []Problem
}

func (e *ProblemsError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d problem(s):", e.What, len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  " + p.String())
	}
	return b.String()
}

// AsError returns nil for no problems, else a *ProblemsError.
func AsError(what string, problems []Problem) error {
	if len(problems) == 0 {
		return nil
	}
	return &ProblemsError{What: what, Problems: problems}
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
	add := func(format string, args ...any) {
		out = append(out, Problem{Module: m.Dir, Msg: fmt.Sprintf(format, args...)})
	}
	if want := modulePathFor(p.RootPath, m.Dir); m.Path != want {
		add("module path %s: its tags %s/vX.Y.Z need the path %s", m.Path, m.Dir, want)
	}
	for _, r := range m.File.Replace {
		add("go.mod has replace %s => %s: a released go.mod must have none (Go ignores a dependency's replace, so a user's build fails); go.work wires the local copies",
			describe(r.Old), describe(r.New))
	}
	for _, r := range m.File.Require {
		req := describeReq(r)
		if IsFakeVersion(r.Mod.Version) {
			add("go.mod requires %s: a fake version no one can download; require a released version", req)
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
			add("go.mod requires %s, a test-only module: every user of %s would get it; move the tests that need it to a module of their own",
				req, m.Dir)
		case p.otherClient(r.Mod.Path, m.Role.Client):
			add("go.mod requires %s, another broker's client: a user of %s must get only %s", req, m.Dir, orNone(m.Role.Client))
		}
	}
	return out
}

// checkSiblingReq checks m's requirement r on another module of this
// repository.
func checkSiblingReq(ws *Workspace, m *Module, r *modfile.Require, add func(string, ...any)) {
	s := ws.Module(r.Mod.Path)
	req := describeReq(r)
	switch {
	case s == nil:
		add("go.mod requires %s, which is not a go.work module", req)
	case s.Role.Kind == Unreleased:
		add("go.mod requires %s, which is never released (%s)", req, s.Role.Kind)
	case m.Role.Kind == Library && s.Role.Kind == Support:
		add("go.mod requires %s, a support module for tests: every user of %s would get it and what it requires; move the tests that need it to a module of their own",
			req, m.Dir)
	case m.Role.Kind == Library && s.Role.Client != "" && s.Role.Client != m.Role.Client:
		add("go.mod requires %s, another backend (with %s)", req, s.Role.Client)
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
	return []Problem{{Module: "(all)", Msg: "sibling requirements name different versions: " + strings.Join(parts, "; ") +
		": released modules move together, each requiring its siblings at the one release version"}}
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

func orNone(client string) string {
	if client == "" {
		return "no broker client"
	}
	return client
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
