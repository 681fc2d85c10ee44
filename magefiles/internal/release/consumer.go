package release

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/module"
)

// A ConsumerEnv says how a consumer's go commands reach the packed
// modules: outside any workspace, through the file proxy first.
type ConsumerEnv struct {
	ProxyDir string // the directory Pack wrote
	// Fallback is the GOPROXY list tried after ProxyDir, for third-party
	// modules ("" for none: everything must be in ProxyDir).
	Fallback string
	// ModCache is the module cache the consumers use: a scratch one, so
	// that a candidate version packed again is never read from a cache.
	ModCache string
	// NoSumDB lists the GONOSUMDB patterns of the packed modules, which no
	// checksum database knows.
	NoSumDB string
	// SumDBOff turns the checksum database off altogether (offline tests).
	SumDBOff bool
	// RunTimeout bounds a consumer program's run (default 1 minute).
	RunTimeout time.Duration
}

// A Consumer is a module outside the workspace that requires one library
// at the candidate version, as a user's would.
type Consumer struct {
	Library *Module
	Dir     string
	Path    string           // the consumer's own module path
	Modules []module.Version // go list -m all, without the consumer itself
	// Graph is go mod graph: each node's requirements; nodes are
	// "path@version", the consumer's own node is its bare path.
	Graph map[string][]string
	// why returns the import chain by which the consumer's packages and
	// their tests need a module (go mod why -m), from the library on;
	// nil when unknown.
	why func(modPath string) []string
}

// BuildConsumer makes a consumer of lib at version in dir (which must not
// exist or be empty): go mod init, go get lib@version, the .go files of
// templateDir, go mod tidy; then it reads the module graph and runs go
// build. When only the build fails, the Consumer it returns with the error
// has its graph.
func BuildConsumer(ctx context.Context, lib *Module, version, templateDir, dir string, env ConsumerEnv) (*Consumer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &Consumer{Library: lib, Dir: dir, Path: "example.com/consumer/" + strings.ReplaceAll(lib.Dir, "/", "-")}
	goEnv, err := env.environ(ctx)
	if err != nil {
		return nil, err
	}
	steps := [][]string{
		{"mod", "init", c.Path},
		{"get", lib.Path + "@" + version},
	}
	for _, args := range steps {
		if _, err := runGo(ctx, dir, goEnv, args...); err != nil {
			return c, err
		}
	}
	if err := copyTemplate(templateDir, dir); err != nil {
		return c, err
	}
	if _, err := runGo(ctx, dir, goEnv, "mod", "tidy"); err != nil {
		return c, err
	}
	list, err := runGo(ctx, dir, goEnv, "list", "-m", "all")
	if err != nil {
		return c, err
	}
	graph, err := runGo(ctx, dir, goEnv, "mod", "graph")
	if err != nil {
		return c, err
	}
	c.Modules, c.Graph = parseModList(list, c.Path), parseModGraph(graph)
	c.why = func(modPath string) []string {
		out, err := runGo(ctx, dir, goEnv, "mod", "why", "-m", modPath)
		if err != nil {
			return nil
		}
		return parseModWhy(out, c.Path)
	}
	_, err = runGo(ctx, dir, goEnv, "build", "-o", "consumer", ".")
	return c, err
}

// Run runs the consumer program BuildConsumer built and returns its
// output; it fails when the program does, or outlives env.RunTimeout.
func (c *Consumer) Run(ctx context.Context, env ConsumerEnv) (string, error) {
	timeout := env.RunTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.Dir, "consumer"))
	cmd.Dir = c.Dir
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("the consumer of %s did not finish within %v: %w", c.Library.Dir, timeout, ctx.Err())
	}
	if err != nil {
		return string(out), fmt.Errorf("the consumer of %s failed: %w\n%s", c.Library.Dir, err, indent(string(out)))
	}
	return string(out), nil
}

// environ returns the environment of a consumer's go commands: this
// process's, with no workspace, the file proxy first, no checksum
// database for the packed modules, the scratch module cache, and
// -mod=mod added to the GOFLAGS the go command would use.
func (env ConsumerEnv) environ(ctx context.Context) ([]string, error) {
	goflags, err := exec.CommandContext(ctx, "go", "env", "GOFLAGS").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOFLAGS: %w", err)
	}
	flags := []string{"-mod=mod", "-modcacherw"}
	for _, f := range strings.Fields(string(goflags)) {
		if !strings.HasPrefix(f, "-mod=") && f != "-modcacherw" {
			flags = append(flags, f)
		}
	}
	proxy := "file://" + filepath.ToSlash(env.ProxyDir)
	if env.Fallback != "" {
		proxy += "," + env.Fallback
	}
	set := map[string]string{
		"GOWORK":      "off",
		"GOPROXY":     proxy,
		"GOFLAGS":     strings.Join(flags, " "),
		"GONOSUMDB":   env.NoSumDB,
		"GOPRIVATE":   "",
		"GONOPROXY":   "",
		"GOMODCACHE":  env.ModCache,
		"GOTOOLCHAIN": "local",
	}
	if env.SumDBOff {
		set["GOSUMDB"] = "off"
	}
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if _, ok := set[name]; !ok {
			out = append(out, kv)
		}
	}
	for _, name := range sortedKeys(set) {
		out = append(out, name+"="+set[name])
	}
	return out, nil
}

// runGo runs the go command in dir with env and returns its stdout; on
// failure the error holds the command and everything it printed.
func runGo(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Env = dir, env
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("(cd %s && go %s): %w\n%s", dir, strings.Join(args, " "), err,
			indent(stdout.String()+stderr.String()))
	}
	return stdout.String(), nil
}

// copyTemplate copies the .go files of a consumer template into dir.
func copyTemplate(templateDir, dir string) error {
	files, err := filepath.Glob(filepath.Join(templateDir, "*.go"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("consumer template %s has no .go file", templateDir)
	}
	for _, f := range files {
		if err := copyFile(f, filepath.Join(dir, filepath.Base(f))); err != nil {
			return err
		}
	}
	return nil
}

// parseModList reads `go list -m all`: "path version" lines, the main
// module's without a version.
func parseModList(out, self string) []module.Version {
	var mods []module.Version
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] == self {
			continue
		}
		mods = append(mods, module.Version{Path: f[0], Version: f[1]})
	}
	return mods
}

// parseModWhy reads the import chain of `go mod why -m`: a "# module"
// line, then one package a line, the consumer's first (left out). It
// returns nil when the main module does not need the module.
func parseModWhy(out, self string) []string {
	var chain []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "(") || under(line, self) {
			continue
		}
		chain = append(chain, line)
	}
	return chain
}

// parseModGraph reads `go mod graph`: "from to" lines.
func parseModGraph(out string) map[string][]string {
	g := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 {
			g[f[0]] = append(g[f[0]], f[1])
		}
	}
	return g
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "    (no output)"
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
