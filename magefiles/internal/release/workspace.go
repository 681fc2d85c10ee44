package release

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
)

// Kind says whether and how a module is released.
type Kind int

const (
	// Unreleased modules are never tagged: the build module, benchmarks,
	// modules that hold only tests. They may require anything.
	Unreleased Kind = iota
	// Library modules are what users import: tagged, and their graph
	// must hold no test-only module and no other broker's client.
	Library
	// Support modules are tagged for backend authors and tests (the
	// conformance suite): they may require test-only modules, but no
	// library may require them.
	Support
)

func (k Kind) String() string {
	switch k {
	case Library:
		return "library"
	case Support:
		return "support module"
	default:
		return "unreleased module"
	}
}

// A Role is what one workspace module is, for releases.
type Role struct {
	Kind Kind
	// Client is the broker client module a Library may require (its
	// path, e.g. github.com/nats-io/nats.go); "" for none.
	Client string
	// Allow lists the modules besides locks and its client's that a
	// Library's users may get (paths, covering the paths below them);
	// anything else in a consumer's graph is a problem.
	Allow []string
	// Why says in a few words why the module has this role; it is shown
	// in the plan.
	Why string
}

// A Policy says what each module of the repository is and which modules a
// user's graph must not hold.
type Policy struct {
	// RootPath is the module path of the repository's root: a module in
	// directory d has path RootPath/d and tags d/vX.Y.Z.
	RootPath string
	// Roles gives every workspace module's role, by directory relative to
	// the root, slash-separated ("." for the root). A workspace module
	// missing here is an error, so that none is released by accident.
	Roles map[string]Role
	// TestOnly lists module paths that only tests need (dockertest,
	// embedded servers, leak checkers); each also covers the paths below
	// it ("github.com/docker" covers "github.com/docker/cli").
	TestOnly []string
	// Clients lists every broker client's module path.
	Clients []string
}

// A Module is one module of the workspace.
type Module struct {
	Dir   string // relative to the root, slash-separated; "." for the root
	Path  string // module path, from its go.mod
	Role  Role
	GoMod []byte        // go.mod's contents
	File  *modfile.File // GoMod parsed
}

// Tag returns the tag that releases m at version: "dir/version".
func (m *Module) Tag(version string) string {
	return m.Dir + "/" + version
}

// A Workspace is the modules of go.work with their roles.
type Workspace struct {
	Root    string    // absolute directory of go.work
	Modules []*Module // in go.work order
	Policy  Policy
}

// Load reads the go.mod of each directory in dirs (absolute, or relative
// to root), as listed by `go work edit -json`, and gives each its role
// from p. It fails when a module has no role, a role names no module, or
// a go.mod cannot be read.
func Load(root string, dirs []string, p Policy) (*Workspace, error) {
	ws := &Workspace{Root: root, Policy: p}
	var errs []error
	seen := map[string]bool{}
	for _, d := range dirs {
		m, err := loadModule(root, d, p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		seen[m.Dir] = true
		ws.Modules = append(ws.Modules, m)
	}
	for _, dir := range sortedKeys(p.Roles) {
		if !seen[dir] {
			errs = append(errs, fmt.Errorf("release policy: %s has a role but is not a go.work module", dir))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return ws, nil
}

func loadModule(root, dir string, p Policy) (*Module, error) {
	abs := dir
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(root, dir)
	}
	rel, err := filepath.Rel(root, abs)
	if err != nil {
		return nil, err
	}
	rel = filepath.ToSlash(rel)
	data, err := os.ReadFile(filepath.Join(abs, "go.mod"))
	if err != nil {
		return nil, err
	}
	f, err := modfile.Parse(path.Join(rel, "go.mod"), data, nil)
	if err != nil {
		return nil, err
	}
	if f.Module == nil {
		return nil, fmt.Errorf("%s/go.mod: no module line", rel)
	}
	role, ok := p.Roles[rel]
	if !ok {
		return nil, fmt.Errorf("release policy: module %s (%s) has no role: say whether it is a Library, a Support module or Unreleased",
			rel, f.Module.Mod.Path)
	}
	return &Module{Dir: rel, Path: f.Module.Mod.Path, Role: role, GoMod: data, File: f}, nil
}

// WithGoMods returns a copy of ws whose modules have the go.mod contents
// of mods (by directory) where it has one.
func (ws *Workspace) WithGoMods(mods map[string][]byte) (*Workspace, error) {
	out := &Workspace{Root: ws.Root, Policy: ws.Policy}
	for _, m := range ws.Modules {
		c := *m
		if data, ok := mods[m.Dir]; ok {
			f, err := modfile.Parse(path.Join(m.Dir, "go.mod"), data, nil)
			if err != nil {
				return nil, err
			}
			c.GoMod, c.File = data, f
		}
		out.Modules = append(out.Modules, &c)
	}
	return out, nil
}

// Module returns the workspace module with the module path modPath, or nil.
func (ws *Workspace) Module(modPath string) *Module {
	for _, m := range ws.Modules {
		if m.Path == modPath {
			return m
		}
	}
	return nil
}

// Released returns the modules that are tagged (Library and Support), in
// go.work order.
func (ws *Workspace) Released() []*Module {
	var out []*Module
	for _, m := range ws.Modules {
		if m.Role.Kind != Unreleased {
			out = append(out, m)
		}
	}
	return out
}

// Order returns the released modules in dependency order: each after the
// siblings it requires. Ties keep go.work order. A cycle is an error.
func (ws *Workspace) Order() ([]*Module, error) {
	released := ws.Released()
	deps := map[string][]string{} // dir -> dirs of the released siblings it requires
	for _, m := range released {
		for _, r := range m.File.Require {
			if s := ws.Module(r.Mod.Path); s != nil && s.Role.Kind != Unreleased && s != m {
				deps[m.Dir] = append(deps[m.Dir], s.Dir)
			}
		}
	}
	var order []*Module
	done := map[string]bool{}
	for len(order) < len(released) {
		progressed := false
		for _, m := range released {
			if done[m.Dir] || !allDone(deps[m.Dir], done) {
				continue
			}
			order = append(order, m)
			done[m.Dir] = true
			progressed = true
			break // restart from the first, so ties keep go.work order
		}
		if !progressed {
			var left []string
			for _, m := range released {
				if !done[m.Dir] {
					left = append(left, m.Dir)
				}
			}
			return nil, fmt.Errorf("the requirements of %s form a cycle: no release order", strings.Join(left, ", "))
		}
	}
	return order, nil
}

func allDone(dirs []string, done map[string]bool) bool {
	for _, d := range dirs {
		if !done[d] {
			return false
		}
	}
	return true
}

// isSibling reports whether modPath is one of this repository's modules.
func (p Policy) isSibling(modPath string) bool {
	return modPath == p.RootPath || strings.HasPrefix(modPath, p.RootPath+"/")
}

// testOnly reports whether modPath is a test-only module.
func (p Policy) testOnly(modPath string) bool {
	return matchAny(modPath, p.TestOnly)
}

// otherClient reports whether modPath is a broker client other than own.
func (p Policy) otherClient(modPath, own string) bool {
	for _, c := range p.Clients {
		if c != own && under(modPath, c) {
			return true
		}
	}
	return false
}

// short names a sibling by its directory, anything else by its path.
func (p Policy) short(modPath string) string {
	if rest, ok := strings.CutPrefix(modPath, p.RootPath+"/"); ok {
		return rest
	}
	return modPath
}

func matchAny(modPath string, prefixes []string) bool {
	return slices.ContainsFunc(prefixes, func(p string) bool { return under(modPath, p) })
}

// under reports whether modPath is prefix or a path below it.
func under(modPath, prefix string) bool {
	return modPath == prefix || strings.HasPrefix(modPath, prefix+"/")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
