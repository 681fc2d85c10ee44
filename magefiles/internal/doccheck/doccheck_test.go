package doccheck

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixture writes files (path → content) under a new directory.
func fixture(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, body := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// base is a small tree whose every reference holds.
var base = map[string]string{
	"go.mod": "module example.com/x\n",
	"lib/lib.go": `// Package lib is a library. [Thing] is its type; see [Thing.Do],
// [Thing.Field] and [other.Helper].
package lib

import "example.com/x/other"

// Thing does things.
type Thing struct{ Field int }

// Do does; TestDo proves it.
func (Thing) Do() { other.Helper() }
`,
	"lib/lib_test.go": "package lib\n\nimport \"testing\"\n\nfunc TestDo(t *testing.T) {}\n",
	"other/other.go":  "// Package other helps.\npackage other\n\n// Helper helps.\nfunc Helper() {}\n\nfunc testCheck() {}\n",
	"docs/a.md": "See `lib/lib.go`, [the lib](../lib/lib.go), `TestDo/sub`, `lib.Thing.Do`,\n" +
		"`other.Check` (a check), `*/lib.go`, `docs/` and `lib.go`.\n\n```\n`TestInAFence` is code\n```\n",
	"CHANGELOG.md": "`TestGoneLongAgo` is history.\n",
}

func TestCheckPassesAValidTree(t *testing.T) {
	got, err := Check(fixture(t, base))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("findings in a tree whose references all hold:\n%v", got)
	}
}

// TestCheckFindsBrokenReferences breaks one reference of each kind and
// expects exactly that one finding.
func TestCheckFindsBrokenReferences(t *testing.T) {
	cases := []struct {
		name, file, body, want string
	}{
		{"test name in Markdown", "docs/b.md", "`TestGone` proves it.\n", "docs/b.md:1: TestGone"},
		{"file path in a code span", "docs/b.md", "\n\nsee `lib/base.go`\n", "docs/b.md:3: lib/base.go"},
		{"Markdown link", "docs/b.md", "[x](../lib/gone.go)\n", "docs/b.md:1: ../lib/gone.go"},
		{"glob matching nothing", "docs/b.md", "`*/gone_test.go`\n", "docs/b.md:1: */gone_test.go"},
		{"package identifier", "docs/b.md", "`lib.Gone`\n", "docs/b.md:1: lib.Gone"},
		{"method of a type", "docs/b.md", "`lib.Thing.Undo`\n", "docs/b.md:1: lib.Thing.Undo"},
		{"doc link in the package", "lib/more.go", "package lib\n\n// Wait: see [Gone].\nvar Wait int\n", "lib/more.go:3: [Gone]"},
		{"doc link to an import", "lib/more.go", "package lib\n\nimport \"example.com/x/other\"\n\n// V: see [other.Gone].\nvar V = other.Helper\n", "lib/more.go:5: [other.Gone]"},
		{"test name in a Go comment", "lib/more.go", "package lib\n\n// V is proved by TestVanished.\nvar V int\n", "lib/more.go:3: TestVanished"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			files := maps.Clone(base)
			files[c.file] = c.body
			got, err := Check(fixture(t, files))
			if err != nil {
				t.Fatal(err)
			}
			var lines []string
			for _, f := range got {
				lines = append(lines, f.String())
			}
			if len(got) != 1 || !strings.HasPrefix(lines[0], c.want+":") {
				t.Fatalf("want one finding %q, got %d:\n%s", c.want, len(got), strings.Join(lines, "\n"))
			}
		})
	}
}
