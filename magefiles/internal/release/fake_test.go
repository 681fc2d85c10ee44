package release

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A fake repository for the tests, shaped like latchkey: a build module at
// the root, a contract (locks) with no broker client, one backend with its
// client, a conformance suite that needs a test-only module, and
// benchmarks that are never released. Its third-party modules live in a
// file proxy, so the tests need no network.
const fakeRoot = "example.test/kit"

var fakeDirs = []string{".", "locks", "contracttest", "backend", "bench"}

func fakePolicy() Policy {
	return Policy{
		RootPath: fakeRoot,
		Roles: map[string]Role{
			".":            {Kind: Unreleased, Why: "build module"},
			"locks":        {Kind: Library, Why: "the contract"},
			"backend":      {Kind: Library, Client: "example.test/client", Why: "a backend"},
			"contracttest": {Kind: Support, Why: "the conformance suite"},
			"bench":        {Kind: Unreleased, Why: "benchmarks"},
		},
		TestOnly: []string{"example.test/dockertest", "example.test/leakcheck"},
		Clients:  []string{"example.test/client", "example.test/otherclient"},
	}
}

// fakeFiles is the clean tree: every released module requires its
// siblings at v0.1.0, the release before the one the tests make.
var fakeFiles = map[string]string{
	"go.mod":       "module example.test/kit\n\ngo 1.26.0\n",
	"locks/go.mod": "module example.test/kit/locks\n\ngo 1.26.0\n",
	"locks/locks.go": "// Package locks is the fake contract.\npackage locks\n\n" +
		"// Name names the package.\nfunc Name() string { return \"locks\" }\n",
	"backend/go.mod": "module example.test/kit/backend\n\ngo 1.26.0\n\nrequire (\n" +
		"\texample.test/client v1.0.0\n\texample.test/kit/locks v0.1.0\n)\n",
	"backend/backend.go": "// Package backend is the fake backend.\npackage backend\n\n" +
		"import (\n\t\"example.test/client\"\n\t\"example.test/kit/locks\"\n)\n\n" +
		"// Hello names what it links.\nfunc Hello() string { return locks.Name() + \"+\" + client.Name() }\n",
	"contracttest/go.mod": "module example.test/kit/contracttest\n\ngo 1.26.0\n\nrequire (\n" +
		"\texample.test/dockertest v1.0.0\n\texample.test/kit/locks v0.1.0\n)\n",
	"contracttest/suite.go": "// Package contracttest is the fake suite.\npackage contracttest\n",
	"bench/go.mod": "module example.test/kit/bench\n\ngo 1.26.0\n\nrequire example.test/kit/backend v0.1.0\n\n" +
		"replace example.test/kit/backend => ../backend\n",
	"CHANGELOG.md": "# Changelog\n\n## [Unreleased]\n\n### Changed\n- backend: Hello names the client.\n",
	"templates/backend/main.go": "package main\n\nimport (\n\t\"fmt\"\n\n\t\"example.test/kit/backend\"\n)\n\n" +
		"func main() { fmt.Println(\"consumer:\", backend.Hello()) }\n",
	"templates/locks/main.go": "package main\n\nimport (\n\t\"fmt\"\n\n\t\"example.test/kit/locks\"\n)\n\n" +
		"func main() { fmt.Println(\"consumer:\", locks.Name()) }\n",
}

// thirdParty are the fake third-party modules, at v1.0.0: the backend's
// client (which, like amqp091-go, requires a test-only module), another
// broker's client, and two test-only modules.
var thirdParty = map[string]string{
	"example.test/client":      "require example.test/leakcheck v1.0.0\n",
	"example.test/otherclient": "",
	"example.test/dockertest":  "",
	"example.test/leakcheck":   "",
	"example.test/extra":       "",
}

// writeTree writes files under dir, with edits applied: a path mapped to
// "" is left out.
func writeTree(t *testing.T, dir string, files, edits map[string]string) {
	t.Helper()
	all := map[string]string{}
	for k, v := range files {
		all[k] = v
	}
	for k, v := range edits {
		all[k] = v
	}
	for name, data := range all {
		if data == "" {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeWorkspace writes the fake tree with edits into a new directory and
// loads it.
func fakeWorkspace(t *testing.T, edits map[string]string) *Workspace {
	t.Helper()
	root := t.TempDir()
	writeTree(t, root, fakeFiles, edits)
	ws, err := Load(root, fakeDirs, fakePolicy())
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// packThirdParty writes the fake third-party modules into proxyDir.
func packThirdParty(t *testing.T, proxyDir string) {
	t.Helper()
	for path, reqs := range thirdParty {
		dir := t.TempDir()
		name := path[strings.LastIndex(path, "/")+1:]
		gomod := "module " + path + "\n\ngo 1.26.0\n\n" + reqs
		writeTree(t, dir, map[string]string{
			"go.mod": gomod,
			name + ".go": "// Package " + name + " is a fake.\npackage " + name + "\n\n" +
				"// Name names the package.\nfunc Name() string { return \"" + name + "\" }\n",
		}, nil)
		if err := PackDir(proxyDir, dir, path, "v1.0.0", []byte(gomod), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
}

// checkOptions returns options for Check on ws that reach only a file
// proxy holding the fake third-party modules: no network.
func checkOptions(t *testing.T, ws *Workspace) CheckOptions {
	t.Helper()
	work := t.TempDir()
	packThirdParty(t, filepath.Join(work, "proxy"))
	return CheckOptions{
		Version:   "v0.0.0-candidate",
		Templates: filepath.Join(ws.Root, "templates"),
		WorkDir:   work,
		Env:       ConsumerEnv{NoSumDB: fakeRoot, SumDBOff: true, RunTimeout: time.Minute},
		Run:       true,
	}
}
