package release

import (
	"context"
	"errors"
	"strings"
	"testing"

	"golang.org/x/mod/module"
)

// TestCheck runs the whole release check (go.mod rules, packing, a
// consumer of each library built from the file proxy outside any
// workspace, its graph, its run) on the fake tree: clean, it passes; with
// each fault a backend's go.mod can gain, it fails, naming the module and
// the requirement at fault.
func TestCheck(t *testing.T) {
	const backendMod = "module example.test/kit/backend\n\ngo 1.26.0\n\nrequire (\n\texample.test/client v1.0.0\n"
	tests := []struct {
		name  string
		edits map[string]string
		want  []string // each must be in some problem; none means Check passes
	}{
		{name: "clean"},
		{
			name: "test-only module through a support module",
			edits: map[string]string{"backend/go.mod": backendMod +
				"\texample.test/kit/contracttest v0.1.0\n\texample.test/kit/locks v0.1.0\n)\n\n" +
				// what go mod tidy adds for the suite's requirements
				"require example.test/dockertest v1.0.0 // indirect\n"},
			want: []string{
				"backend: go.mod requires example.test/kit/contracttest v0.1.0: a support module for tests",
				"backend: go.mod requires example.test/dockertest v1.0.0 (indirect): a test-only module",
				"backend consumer: holds example.test/kit/contracttest v0.0.0-candidate: a support module for tests, " +
					"via backend@v0.0.0-candidate → contracttest@v0.0.0-candidate",
				"backend consumer: holds example.test/dockertest v1.0.0: a test-only module, " +
					"via backend@v0.0.0-candidate → example.test/dockertest@v1.0.0",
			},
		},
		{
			name: "test-only module missing from an untidy go.mod",
			edits: map[string]string{
				"backend/go.mod":          backendMod + "\texample.test/kit/contracttest v0.1.0\n\texample.test/kit/locks v0.1.0\n)\n",
				"backend/backend_test.go": "package backend\n\nimport _ \"example.test/kit/contracttest\"\n",
				"contracttest/suite.go": "// Package contracttest is the fake suite.\npackage contracttest\n\n" +
					"import _ \"example.test/dockertest\"\n",
			},
			want: []string{
				"backend consumer: holds example.test/dockertest v1.0.0: a test-only module, listed by the consumer's go mod tidy " +
					"for the imports backend → backend.test → contracttest → example.test/dockertest",
			},
		},
		{
			name: "test-only module required directly",
			edits: map[string]string{"backend/go.mod": backendMod +
				"\texample.test/dockertest v1.0.0\n\texample.test/kit/locks v0.1.0\n)\n"},
			want: []string{
				"backend: go.mod requires example.test/dockertest v1.0.0: a test-only module",
				"backend consumer: holds example.test/dockertest v1.0.0: a test-only module, " +
					"via backend@v0.0.0-candidate → example.test/dockertest@v1.0.0",
			},
		},
		{
			name: "another broker's client",
			edits: map[string]string{"backend/go.mod": backendMod +
				"\texample.test/kit/locks v0.1.0\n\texample.test/otherclient v1.0.0\n)\n"},
			want: []string{
				"backend: go.mod requires example.test/otherclient v1.0.0: another broker's client (backend may have only example.test/client)",
				"backend consumer: holds example.test/otherclient v1.0.0: another broker's client, via backend@v0.0.0-candidate",
			},
		},
		{
			name: "a module its client does not bring",
			edits: map[string]string{"backend/go.mod": backendMod +
				"\texample.test/extra v1.0.0\n\texample.test/kit/locks v0.1.0\n)\n"},
			want: []string{"backend consumer: holds 1 more module(s) that its broker client example.test/client does not bring: example.test/extra v1.0.0"},
		},
		{
			name: "fake version and replace",
			edits: map[string]string{"backend/go.mod": backendMod +
				"\texample.test/kit/locks v0.0.0\n)\n\nreplace example.test/kit/locks => ../locks\n"},
			want: []string{
				"backend: go.mod requires example.test/kit/locks v0.0.0: a fake version",
				"backend: go.mod has replace example.test/kit/locks => ../locks",
			},
		},
		{
			name: "zero pseudo-version in a support module",
			edits: map[string]string{"contracttest/go.mod": "module example.test/kit/contracttest\n\ngo 1.26.0\n\n" +
				"require (\n\texample.test/dockertest v1.0.0\n\texample.test/kit/locks v0.0.0-00010101000000-000000000000\n)\n"},
			want: []string{"contracttest: go.mod requires example.test/kit/locks v0.0.0-00010101000000-000000000000: a fake version"},
		},
		{
			name: "siblings at different versions",
			edits: map[string]string{"contracttest/go.mod": "module example.test/kit/contracttest\n\ngo 1.26.0\n\n" +
				"require (\n\texample.test/dockertest v1.0.0\n\texample.test/kit/locks v0.0.9\n)\n"},
			want: []string{"(all): sibling requirements name different versions: v0.0.9 (contracttest requires locks); v0.1.0 (backend requires locks)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ws := fakeWorkspace(t, tt.edits)
			opts := checkOptions(t, ws)
			var log strings.Builder
			opts.Log = &log
			err := Check(context.Background(), ws, opts)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Check of a clean tree: %v\nlog:\n%s", err, log.String())
				}
				for _, out := range []string{"consumer: locks+client", "consumer: locks"} {
					if !strings.Contains(log.String(), out) {
						t.Errorf("the consumers' output lacks %q:\n%s", out, log.String())
					}
				}
				return
			}
			var pe *ProblemsError
			if !errors.As(err, &pe) {
				t.Fatalf("Check = %v, want a *ProblemsError\nlog:\n%s", err, log.String())
			}
			for _, want := range tt.want {
				if !hasProblem(pe.Problems, want) {
					t.Errorf("no problem says %q; got:\n%v", want, err)
				}
			}
			for _, p := range pe.Problems {
				if p.Fix != "" && (!strings.Contains(err.Error(), "\nto fix:") || !strings.Contains(err.Error(), "\n  - "+p.Fix)) {
					t.Errorf("the error does not say how to fix %q:\n%v", p, err)
				}
			}
		})
	}
}

// TestCheckAllowsWhatTheOwnClientBrings: the fake client requires a
// test-only module, as amqp091-go requires goleak; the backend cannot
// help that, so its consumer's graph may hold it, and a support module's
// go.mod may hold test-only modules.
func TestCheckAllowsWhatTheOwnClientBrings(t *testing.T) {
	ws := fakeWorkspace(t, nil)
	opts := checkOptions(t, ws)
	opts.Run = false
	var log strings.Builder
	opts.Log = &log
	if err := Check(context.Background(), ws, opts); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "example.test/leakcheck v1.0.0") {
		t.Errorf("the backend consumer's graph lacks the client's test-only requirement, so this test shows nothing:\n%s", log.String())
	}
}

func hasProblem(problems []Problem, want string) bool {
	for _, p := range problems {
		if strings.Contains(p.String(), want) {
			return true
		}
	}
	return false
}

func TestIsFakeVersion(t *testing.T) {
	for v, want := range map[string]bool{
		"v0.0.0":                             true,
		"v0.0.0-00010101000000-000000000000": true,
		"v0.0.0-20260101120000-000000000000": true,
		"v0.0.0-20260101120000-abcdef012345": false,
		"v0.1.0":                             false,
		"v0.0.0-candidate":                   false,
		"v1.2.3":                             false,
	} {
		if got := IsFakeVersion(v); got != want {
			t.Errorf("IsFakeVersion(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestLoadNeedsARoleForEveryModule(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, fakeFiles, map[string]string{"extra/go.mod": "module example.test/kit/extra\n\ngo 1.26.0\n"})
	_, err := Load(root, append(fakeDirs, "extra"), fakePolicy())
	if err == nil || !strings.Contains(err.Error(), "module extra (example.test/kit/extra) has no role") {
		t.Errorf("Load with an unclassified module = %v, want an error naming it", err)
	}
	p := fakePolicy()
	p.Roles["gone"] = Role{Kind: Library}
	_, err = Load(root, fakeDirs, p)
	if err == nil || !strings.Contains(err.Error(), "gone has a role but is not a go.work module") {
		t.Errorf("Load with a role for no module = %v, want an error naming it", err)
	}
}

func TestOrder(t *testing.T) {
	ws := fakeWorkspace(t, nil)
	order, err := ws.Order()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(order), "locks, contracttest, backend"; got != want {
		t.Errorf("Order = %s, want %s", got, want)
	}
	ws = fakeWorkspace(t, map[string]string{
		"locks/go.mod": "module example.test/kit/locks\n\ngo 1.26.0\n\nrequire example.test/kit/backend v0.1.0\n",
	})
	if _, err := ws.Order(); err == nil || !strings.Contains(err.Error(), "form a cycle") {
		t.Errorf("Order with a cycle = %v, want a cycle error", err)
	}
}

// TestCheckConsumerGraph checks the graph rules alone, on graphs written
// out: what the client brings is allowed at whatever version the graph
// selected; what only the library brings is not.
func TestCheckConsumerGraph(t *testing.T) {
	ws := fakeWorkspace(t, nil)
	lib := ws.Module(fakeRoot + "/backend")
	const cand = "v0.0.0-candidate"
	base := map[string][]string{
		"example.com/consumer/backend":          {"example.test/kit/backend@" + cand},
		"example.test/kit/backend@" + cand:      {"example.test/kit/locks@" + cand, "example.test/client@v1.0.0", "example.test/crypto@v2.0.0"},
		"example.test/client@v1.0.0":            {"example.test/crypto@v1.0.0", "example.test/leakcheck@v1.0.0"},
		"example.test/crypto@v2.0.0":            {"example.test/net@v1.0.0"},
		"example.test/kit/locks@" + cand:        nil,
		"example.test/kit/contracttest@" + cand: {"example.test/dockertest@v1.0.0"},
	}
	mods := "example.test/client v1.0.0,example.test/crypto v2.0.0,example.test/kit/backend " + cand +
		",example.test/kit/locks " + cand + ",example.test/leakcheck v1.0.0,example.test/net v1.0.0"
	tests := []struct {
		name  string
		edges map[string][]string // added to base
		mods  string              // added to mods
		want  []string
	}{
		{name: "only the client's modules, at the versions selected"},
		{
			name:  "a test-only module the library brings",
			edges: map[string][]string{"example.test/kit/backend@" + cand: {"example.test/dockertest@v1.0.0"}},
			mods:  "example.test/dockertest v1.0.0",
			want:  []string{"holds example.test/dockertest v1.0.0: a test-only module, via backend@v0.0.0-candidate → example.test/dockertest@v1.0.0"},
		},
		{
			name:  "a module only the library brings",
			edges: map[string][]string{"example.test/kit/backend@" + cand: {"example.test/extra@v1.0.0"}},
			mods:  "example.test/extra v1.0.0",
			want:  []string{"holds 1 more module(s) that its broker client example.test/client does not bring: example.test/extra v1.0.0"},
		},
		{
			name:  "a support module",
			edges: map[string][]string{"example.test/kit/backend@" + cand: {"example.test/kit/contracttest@" + cand}},
			mods:  "example.test/kit/contracttest " + cand + ",example.test/dockertest v1.0.0",
			want: []string{
				"holds example.test/kit/contracttest v0.0.0-candidate: a support module for tests, via backend@v0.0.0-candidate → contracttest@v0.0.0-candidate",
				"holds example.test/dockertest v1.0.0: a test-only module, via backend@v0.0.0-candidate → contracttest@v0.0.0-candidate → example.test/dockertest@v1.0.0",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Consumer{Library: lib, Path: "example.com/consumer/backend", Graph: map[string][]string{}}
			for k, v := range base {
				c.Graph[k] = v
			}
			for k, v := range tt.edges {
				c.Graph[k] = append(c.Graph[k], v...)
			}
			all := mods
			if tt.mods != "" {
				all += "," + tt.mods
			}
			for _, m := range strings.Split(all, ",") {
				path, version, _ := strings.Cut(m, " ")
				c.Modules = append(c.Modules, module.Version{Path: path, Version: version})
			}
			problems := CheckConsumer(ws, c, cand)
			if len(problems) != len(tt.want) {
				t.Errorf("CheckConsumer found %d problem(s), want %d: %v", len(problems), len(tt.want), problems)
			}
			for _, want := range tt.want {
				if !hasProblem(problems, want) {
					t.Errorf("no problem says %q; got %v", want, problems)
				}
			}
		})
	}
}
