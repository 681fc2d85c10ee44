// Package doccheck finds references in the project's documentation that
// point at nothing: a test name, a file path, a Go doc link or a Go
// identifier that does not exist in the tree. It backs `go run mage.go
// docs`, which Lint runs, so that a rename or a move cannot leave a doc
// quoting the old name.
//
// What it reads:
//   - Markdown files (README.md, CONTRIBUTING.md, docs/**/*.md, and the
//     other .md files of the tree except CHANGELOG.md, which is history):
//     code spans and links;
//   - Go comments of every non-test .go file: doc links ([Name],
//     [pkg.Name], [Type.Method]) and test names.
//
// What it checks:
//   - a test name (Test…, Benchmark…, Fuzz…, Example…, optionally with a
//     /subtest) is a top-level function of some _test.go file;
//   - a path with a file extension or a trailing slash, in a code span or
//     a link, names a file or directory of the tree (relative to the root
//     or to the document, or as the tail of a path in the tree); spans with
//     wildcards match at least one path;
//   - pkg.Name in a code span, where pkg is the name of one of the tree's
//     packages, names an identifier of such a package (contracttest.X may
//     also name the conformance check X, run by a function testX);
//   - a doc link in a Go comment names an identifier of its own package,
//     or of an imported package of the tree. Links to other modules and to
//     the standard library are left to go doc.
package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// A Finding is one reference that points at nothing.
type Finding struct {
	File string // relative to the root, slash-separated
	Line int
	Ref  string // as written
	Why  string
}

func (f Finding) String() string { return fmt.Sprintf("%s:%d: %s: %s", f.File, f.Line, f.Ref, f.Why) }

// skipDirs are directories that hold no documentation of the project.
var skipDirs = map[string]bool{".git": true, "testdata": true, "node_modules": true, "vendor": true}

// skipDocs are Markdown files that are history, not a description of the tree.
var skipDocs = map[string]bool{"CHANGELOG.md": true}

// Check reads the tree at root and returns every reference that points at
// nothing, in file order.
func Check(root string) ([]Finding, error) {
	t, err := load(root)
	if err != nil {
		return nil, err
	}
	var out []Finding
	for _, md := range t.markdown {
		fs, err := t.checkMarkdown(md)
		if err != nil {
			return nil, err
		}
		out = append(out, fs...)
	}
	for _, gf := range t.goFiles {
		out = append(out, t.checkComments(gf)...)
	}
	return out, nil
}

// tree is what Check knows of the repository.
type tree struct {
	root     string
	paths    map[string]bool // every file and directory, slash-separated, relative
	list     []string        // the same, sorted
	tests    map[string]bool // top-level test, benchmark, fuzz and example functions
	markdown []string
	goFiles  []*goFile
	pkgs     map[string]*pkg // by directory
	byName   map[string][]*pkg
	byImport map[string]*pkg
}

// pkg is one Go package of the tree (non-test files).
type pkg struct {
	dir, name, importPath string
	idents                map[string]bool // Name, Type.Method, Type.Field
}

type goFile struct {
	rel  string
	fset *token.FileSet
	file *ast.File
	pkg  *pkg
}

func load(root string) (*tree, error) {
	t := &tree{root: root, paths: map[string]bool{}, tests: map[string]bool{}, pkgs: map[string]*pkg{},
		byName: map[string][]*pkg{}, byImport: map[string]*pkg{}}
	modules := map[string]string{} // dir → module path
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (skipDirs[d.Name()] || strings.HasPrefix(d.Name(), ".") && d.Name() != ".github" && d.Name() != ".ci") {
				return filepath.SkipDir
			}
			if rel != "." {
				t.paths[rel] = true
			}
			return nil
		}
		t.paths[rel] = true
		switch {
		case d.Name() == "go.mod":
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if m := regexp.MustCompile(`(?m)^module\s+(\S+)`).FindSubmatch(b); m != nil {
				modules[path.Dir(rel)] = string(m[1])
			}
		case strings.HasSuffix(rel, ".md") && !skipDocs[path.Base(rel)]:
			t.markdown = append(t.markdown, rel)
		case strings.HasSuffix(rel, ".go"):
			return t.parseGo(rel)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for dir, p := range t.pkgs {
		p.importPath = importPath(modules, dir)
		t.byImport[p.importPath] = p
		t.byName[p.name] = append(t.byName[p.name], p)
	}
	for p := range t.paths {
		t.list = append(t.list, p)
	}
	slices.Sort(t.list)
	return t, nil
}

// importPath is dir's import path, from the nearest enclosing module.
func importPath(modules map[string]string, dir string) string {
	for d := dir; ; d = path.Dir(d) {
		if m, ok := modules[d]; ok {
			rest := strings.TrimPrefix(strings.TrimPrefix(dir, d), "/")
			if d == "." {
				rest = dir
			}
			if rest == "" || rest == "." {
				return m
			}
			return m + "/" + rest
		}
		if d == "." || d == "/" {
			return dir
		}
	}
}

var testFunc = regexp.MustCompile(`^(Test|Benchmark|Fuzz|Example)`)

func (t *tree) parseGo(rel string) error {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join(t.root, rel), nil, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return nil // a file that does not parse is go vet's to report
	}
	if strings.HasSuffix(rel, "_test.go") {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && testFunc.MatchString(fd.Name.Name) {
				t.tests[fd.Name.Name] = true
			}
		}
		return nil
	}
	dir := path.Dir(rel)
	p := t.pkgs[dir]
	if p == nil {
		p = &pkg{dir: dir, name: f.Name.Name, idents: map[string]bool{}}
		t.pkgs[dir] = p
	}
	addIdents(p, f)
	t.goFiles = append(t.goFiles, &goFile{rel: rel, fset: fset, file: f, pkg: p})
	return nil
}

// addIdents records f's package-level names, methods and struct fields.
func addIdents(p *pkg, f *ast.File) {
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				p.idents[d.Name.Name] = true
				// contracttest's checks: a function testX runs check X.
				if c, ok := strings.CutPrefix(d.Name.Name, "test"); ok && c != "" && c[0] >= 'A' && c[0] <= 'Z' {
					p.idents[c] = true
				}
				continue
			}
			if r := recvType(d.Recv.List[0].Type); r != "" {
				p.idents[r+"."+d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					p.idents[s.Name.Name] = true
					addMembers(p, s)
				case *ast.ValueSpec:
					for _, n := range s.Names {
						p.idents[n.Name] = true
					}
				}
			}
		}
	}
}

func addMembers(p *pkg, s *ast.TypeSpec) {
	var fields *ast.FieldList
	switch tt := s.Type.(type) {
	case *ast.StructType:
		fields = tt.Fields
	case *ast.InterfaceType:
		fields = tt.Methods
	default:
		return
	}
	for _, fl := range fields.List {
		for _, n := range fl.Names {
			p.idents[s.Name.Name+"."+n.Name] = true
		}
		if len(fl.Names) == 0 { // embedded: its name is a field
			if n := recvType(fl.Type); n != "" {
				p.idents[s.Name.Name+"."+n] = true
			}
		}
	}
}

// recvType is the name of a receiver or embedded type: T, *T, T[P], pkg.T.
func recvType(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvType(e.X)
	case *ast.IndexExpr:
		return recvType(e.X)
	case *ast.IndexListExpr:
		return recvType(e.X)
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// testRef reports whether s names a test and returns the function's name.
func testRef(s string) (string, bool) {
	m := regexp.MustCompile(`^((?:Test|Benchmark|Fuzz)[A-Z0-9_]\w*|Example\w*)(/\S*)?$`).FindStringSubmatch(s)
	if m == nil {
		return "", false
	}
	return m[1], true
}

func (t *tree) checkTest(name string) string {
	if t.tests[name] {
		return ""
	}
	return "no test function of that name"
}

var (
	codeSpan = regexp.MustCompile("`([^`\n]+)`")
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	fence    = regexp.MustCompile("^\\s*```")
	extPath  = regexp.MustCompile(`^[\w./*-]+\.(go|md|pml|yml|yaml|json|svg|mod|sum|sh|txt)$|^[\w.*-]+(/[\w.*-]+)*/$`)
	pkgIdent = regexp.MustCompile(`^\*?([a-z][a-z0-9]*)\.([A-Z]\w*)(?:\.([A-Za-z]\w*))?(?:\(.*\))?$`)
)

func (t *tree) checkMarkdown(rel string) ([]Finding, error) {
	b, err := os.ReadFile(filepath.Join(t.root, rel))
	if err != nil {
		return nil, err
	}
	var out []Finding
	inFence := false
	for i, line := range strings.Split(string(b), "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		add := func(ref, why string) {
			if why != "" {
				out = append(out, Finding{File: rel, Line: i + 1, Ref: ref, Why: why})
			}
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			add(m[1], t.checkSpan(rel, m[1]))
		}
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			add(m[1], t.checkLink(rel, m[1]))
		}
	}
	return out, nil
}

// checkSpan checks one code span of a Markdown file; it returns why it
// points at nothing, or "".
func (t *tree) checkSpan(doc, s string) string {
	s = strings.TrimSpace(s)
	if name, ok := testRef(s); ok {
		return t.checkTest(name)
	}
	if extPath.MatchString(s) && !strings.HasPrefix(s, "-") && !strings.HasPrefix(s, ".") {
		return t.checkPath(doc, s)
	}
	if m := pkgIdent.FindStringSubmatch(s); m != nil {
		return t.checkIdent(t.byName[m[1]], m[2], m[3])
	}
	return ""
}

// checkLink checks the target of a Markdown link.
func (t *tree) checkLink(doc, target string) string {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
		return ""
	}
	target, _, _ = strings.Cut(target, "#")
	p := path.Clean(path.Join(path.Dir(doc), target))
	if t.paths[p] {
		return ""
	}
	return "no such file or directory (relative to " + doc + ")"
}

// checkPath checks a path quoted in a document.
func (t *tree) checkPath(doc, s string) string {
	s = strings.TrimSuffix(s, "/")
	if strings.ContainsAny(s, "*") {
		for _, p := range t.list {
			if ok, _ := path.Match(s, p); ok {
				return ""
			}
		}
		return "matches no file"
	}
	if t.paths[s] || t.paths[path.Clean(path.Join(path.Dir(doc), s))] {
		return ""
	}
	for _, p := range t.list {
		if strings.HasSuffix(p, "/"+s) {
			return ""
		}
	}
	return "no such file or directory"
}

// checkIdent checks Name or Name.Member against the packages of one name
// (several directories may hold packages of the same name).
func (t *tree) checkIdent(ps []*pkg, name, member string) string {
	if len(ps) == 0 {
		return "" // not a package of the tree: go doc's to check
	}
	want := name
	if member != "" {
		want = name + "." + member
	}
	for _, p := range ps {
		if p.idents[want] {
			return ""
		}
	}
	return fmt.Sprintf("no identifier %s in package %s", want, ps[0].name)
}

var docLink = regexp.MustCompile(`(^|[\s(,;"'])\[(\*?)([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*){0,2})\]([^(:\[]|$)`)

// checkComments checks the doc links and test names in a Go file's
// comments. Code blocks (lines indented past the comment's margin) are
// left alone.
func (t *tree) checkComments(gf *goFile) []Finding {
	imports := map[string]string{} // local name → import path
	for _, is := range gf.file.Imports {
		ip, _ := strconv.Unquote(is.Path.Value)
		name := path.Base(ip)
		if p, ok := t.byImport[ip]; ok {
			name = p.name
		}
		if is.Name != nil {
			name = is.Name.Name
		}
		imports[name] = ip
	}
	var out []Finding
	for _, cg := range gf.file.Comments {
		for _, c := range cg.List {
			for j, line := range strings.Split(c.Text, "\n") {
				line = strings.TrimPrefix(strings.TrimPrefix(line, "//"), "/*")
				if strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "  ") || strings.HasPrefix(strings.TrimSpace(line), "go:") {
					continue
				}
				pos := gf.fset.Position(c.Pos())
				for _, m := range docLink.FindAllStringSubmatch(line, -1) {
					if why := t.checkDocLink(gf, imports, m[3]); why != "" {
						out = append(out, Finding{File: gf.rel, Line: pos.Line + j, Ref: "[" + m[2] + m[3] + "]", Why: why})
					}
				}
				for _, w := range strings.FieldsFunc(line, func(r rune) bool { return !(r == '_' || r == '/' || isAlnum(r)) }) {
					if name, ok := testRef(w); ok && strings.HasPrefix(w, "Test") && !t.isIdent(name) {
						if why := t.checkTest(name); why != "" {
							out = append(out, Finding{File: gf.rel, Line: pos.Line + j, Ref: w, Why: why})
						}
					}
				}
			}
		}
	}
	return out
}

// isIdent reports whether some package of the tree declares name (a
// mage target such as TestShort is no test).
func (t *tree) isIdent(name string) bool {
	for _, p := range t.pkgs {
		if p.idents[name] {
			return true
		}
		for id := range p.idents {
			if strings.HasSuffix(id, "."+name) {
				return true
			}
		}
	}
	return false
}

func isAlnum(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}

// checkDocLink resolves one doc link as go doc would: Name and Type.Member
// in the file's own package, pkg.Name and pkg.Type.Member in an imported
// package. Links whose first part is lowercase and not an import of the
// tree's packages (the standard library, other modules) are not checked.
func (t *tree) checkDocLink(gf *goFile, imports map[string]string, ref string) string {
	parts := strings.Split(ref, ".")
	first := parts[0]
	if first[0] >= 'A' && first[0] <= 'Z' {
		if len(parts) > 2 {
			return "a doc link has at most Type.Member after the package"
		}
		return t.checkIdent([]*pkg{gf.pkg}, parts[0], strings.Join(parts[1:], ""))
	}
	ip, ok := imports[first]
	if !ok {
		if len(parts) == 1 {
			return "" // [name]: a package link, or text in brackets
		}
		// Imported by another file of the package, go doc resolves it.
		return t.checkIdent(t.byName[first], parts[1], strings.Join(parts[2:], ""))
	}
	p, ok := t.byImport[ip]
	if !ok || len(parts) == 1 {
		return ""
	}
	return t.checkIdent([]*pkg{p}, parts[1], strings.Join(parts[2:], ""))
}
