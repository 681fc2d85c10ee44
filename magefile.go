//go:build mage

// Build targets of latchkey: `go run mage.go <target>`, no mage install needed; -v shows every command's output.
package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/magefile/mage/mg"
	"github.com/magefile/mage/sh"
)

// Every target works on all the modules of the workspace, read from
// `go work edit -json`: `go test ./...` at the root does not reach them.
// Each command is echoed before it runs; a quiet one shows its output when it
// fails, or always with -v.
//
// Environment:
//
//	TESTFLAGS       extra go test flags for test and testShort, e.g. TESTFLAGS='-run TestLock -v'
//	FUZZTIME        how long testShort fuzzes each target (default 3s)
//	BENCH           benchmark regexp for bench (default .)
//	BENCHFLAGS      extra go test flags for bench, e.g. BENCHFLAGS='-count=10 -benchtime=2s'
//	LOCKBENCH_ARGS  arguments for lockbench
//	CHAOS_DURATION  how long chaos runs each backend (default 5m)
//	CI              set on CI: tests fail on a missing broker instead of skipping; lint shows gofmt diffs

// Tools run with `go run pkg@version`: pinned, and nothing to install.
const (
	staticcheck = "honnef.co/go/tools/cmd/staticcheck@v0.8.2"
	actionlint  = "github.com/rhysd/actionlint/cmd/actionlint@v1.7.12"
)

const (
	testTimeout      = "20m" // per module: go test -timeout
	defaultFuzzTime  = "3s"
	defaultChaosTime = "5m"
	chaosDurationEnv = "LOCKS_CHAOS_DURATION" // contracttest.ChaosDurationEnv
	lockbenchPkg     = "./benchmarks/cmd/lockbench"
	workflowsDir     = ".github/workflows"
	ciScript         = ".ci/run"
	lintTags         = "-tags=mage" // so vet and staticcheck see magefile.go too
	composeFile      = "docker-compose.yml"
	modelsDir        = "models"
	composeEnvExport = `export LOCKS_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/
export LOCKS_REDIS_ADDRS=127.0.0.1:6379,127.0.0.1:6380,127.0.0.1:6381
export LOCKS_NATS_URL=nats://127.0.0.1:4222`
)

// Default is the target run by a bare `go run mage.go`.
var Default = Test

// BrokerVersions prints the broker versions the tests will find.
func BrokerVersions() { printBrokerVersions() }

// Test runs go test -race on every workspace module, with $TESTFLAGS.
func Test() error {
	extra, err := envArgs("TESTFLAGS")
	if err != nil {
		return err
	}
	if isCI() {
		fmt.Println("CI is set: a test that finds no broker fails instead of skipping")
	}
	printBrokerVersions()
	return eachModule("go test", nil, func(m module) error {
		args := append([]string{"test", "-race", "-count=1", "-timeout=" + testTimeout, "./..."}, extra...)
		return runV("go", m.goC(args...)...)
	})
}

// TestShort runs go test -short -race on every module, then each fuzz target for $FUZZTIME (3s).
func TestShort() error {
	extra, err := envArgs("TESTFLAGS")
	if err != nil {
		return err
	}
	fuzzTime := os.Getenv("FUZZTIME")
	if fuzzTime == "" {
		fuzzTime = defaultFuzzTime
	}
	short := eachModule("go test -short", nil, func(m module) error {
		args := append([]string{"test", "-short", "-race", "-count=1", "-timeout=" + testTimeout, "./..."}, extra...)
		return runV("go", m.goC(args...)...)
	})
	// Fuzz even when a test failed: one run reports both.
	fuzz := eachModule("fuzz", nil, func(m module) error {
		targets, err := fuzzTargets(m)
		if err != nil {
			return err
		}
		var errs []error
		for _, t := range targets {
			// -fuzz takes one package and one target at a time.
			err := run("go", m.goC("test", "-run=^$", "-fuzz=^"+t.name+"$", "-fuzztime="+fuzzTime, t.pkg)...)
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	return errors.Join(short, fuzz)
}

// Bench runs the benchmarks of every workspace module matching $BENCH (.), with $BENCHFLAGS.
func Bench() error {
	bench := os.Getenv("BENCH")
	if bench == "" {
		bench = "."
	}
	extra, err := envArgs("BENCHFLAGS")
	if err != nil {
		return err
	}
	return eachModule("go test -bench", nil, func(m module) error {
		args := append([]string{"test", "-run=^$", "-bench=" + bench, "-benchmem", "-timeout=" + testTimeout, "./..."}, extra...)
		return runV("go", m.goC(args...)...)
	})
}

// Lint runs gofmt, go vet, staticcheck and actionlint, and reports every finding.
func Lint() error {
	errs := []error{gofmt()}
	// vet and staticcheck take the module's packages as a pattern from here,
	// rather than run inside it, so that they name files from here.
	errs = append(errs, eachModule("go vet", []string{lintTags}, func(m module) error {
		return run("go", "vet", lintTags, m.packages())
	}))
	errs = append(errs, eachModule("staticcheck", []string{lintTags}, func(m module) error {
		return run("go", "run", staticcheck, lintTags, m.packages())
	}))
	errs = append(errs, lintWorkflows(), lintScripts(), lintBrokerDeps())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("lint failed:\n%w", err)
	}
	return nil
}

// brokerClients are the broker libraries a backend may link, and
// ownClient says which one each module may: a user who imports one backend
// gets no other broker's client, and the contract (locks) none at all.
var (
	brokerClients = []string{
		"github.com/nats-io/nats.go", "github.com/rabbitmq/amqp091-go",
		"github.com/redis/go-redis/v9", "github.com/nats-io/nats-server/v2",
	}
	ownClient = map[string]string{
		"locks":       "",
		"natsputex":   "github.com/nats-io/nats.go",
		"amqpsem":     "github.com/rabbitmq/amqp091-go",
		"redlockprio": "github.com/redis/go-redis/v9",
		// The commands, modules of their own since issue 21.
		"natsputex/cmd/natslock":     "github.com/nats-io/nats.go",
		"amqpsem/cmd/amqpsem":        "github.com/rabbitmq/amqp091-go",
		"redlockprio/cmd/redlockrun": "github.com/redis/go-redis/v9",
	}
)

// lintBrokerDeps checks that what a user builds from each backend module
// (its packages and commands, not its tests) links only its own broker's
// client, as the README says.
func lintBrokerDeps() error {
	root, err := workspaceRoot()
	if err != nil {
		return err
	}
	var errs []error
	for dir, own := range ownClient {
		deps, err := output("go", "-C", filepath.Join(root, dir), "list", "-deps", "./...")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, d := range strings.Fields(deps) {
			for _, client := range brokerClients {
				if client != own && (d == client || strings.HasPrefix(d, client+"/")) {
					errs = append(errs, fmt.Errorf("%s links %s (go list -deps), not its own broker's client", dir, d))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Check runs Lint, then Models, then Test.
func Check() {
	mg.SerialDeps(Lint, Models, Test)
}

// A protocolModel is one Promela model of models/: checked as it is, it
// must hold; compiled with each of its seeded bugs (-D<macro>), spin must
// find a counterexample.
type protocolModel struct {
	file   string
	cc     []string // extra flags for compiling pan.c
	pan    []string // extra flags for running pan
	seeded []string // macros that each select a seeded bug
}

// protocolModels lists every model in models/; Models fails on a .pml file
// missing here, so that none is silently skipped. The flags are the ones
// each model's header comment gives.
var protocolModels = []protocolModel{
	{file: "natsputex_takeover.pml", pan: []string{"-E"}, seeded: []string{"BUGGY", "BUGGY2"}},
	{file: "redlockprio_theft.pml", cc: []string{"-DCOLLAPSE"}, pan: []string{"-E"}, seeded: []string{"BUGGY"}},
	{file: "amqpsem_semaphore.pml", cc: []string{"-DCOLLAPSE"}, seeded: []string{"BUGGY", "BUGGY_LAYOUT"}},
}

// Models checks the protocol models in models/ with spin, and that each seeded bug is found.
func Models() error {
	for _, tool := range []string{"spin", "cc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("models: %s is not installed (Debian/Ubuntu: apt-get install spin gcc): %w", tool, err)
		}
	}
	root, err := workspaceRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, modelsDir)
	files, err := filepath.Glob(filepath.Join(dir, "*.pml"))
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, m := range protocolModels {
		known[m.file] = true
	}
	var errs []error
	for _, f := range files {
		if !known[filepath.Base(f)] {
			errs = append(errs, fmt.Errorf("models: %s is not listed in magefile.go's protocolModels", display(f)))
		}
	}
	for _, m := range protocolModels {
		errs = append(errs, checkModel(filepath.Join(dir, m.file), m, ""))
		for _, bug := range m.seeded {
			errs = append(errs, checkModel(filepath.Join(dir, m.file), m, bug))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("models failed:\n%w", err)
	}
	return nil
}

var (
	panErrors = regexp.MustCompile(`errors: (\d+)`)
	panStates = regexp.MustCompile(`(\d+) states, stored`)
)

// checkModel runs spin -a on a copy of the model in a temporary directory
// (spin and pan write their files into the current one), compiles pan and
// runs it. Without bug, pan must finish its search with no error; with
// bug, spin -D<bug> must lead pan to at least one error. A model that
// fails when it should hold has its counterexample replayed (spin -t).
func checkModel(path string, m protocolModel, bug string) error {
	name := m.file
	var defs []string
	if bug != "" {
		name += " -D" + bug
		defs = []string{"-D" + bug}
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	tmp, err := os.MkdirTemp("", "latchkey-models-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, m.file), src, 0o644); err != nil {
		return err
	}
	if _, err := outputIn(tmp, "spin", append(append(defs, "-a"), m.file)...); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	// -w: pan.c's generated code draws warnings from newer compilers.
	ccArgs := append(append([]string{"-O2", "-w", "-DSAFETY", "-DMEMLIM=2048"}, m.cc...), "-o", "pan", "pan.c")
	if _, err := outputIn(tmp, "cc", ccArgs...); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	start := time.Now()
	out, err := outputIn(tmp, "./pan", append([]string{"-m100000"}, m.pan...)...)
	took := time.Since(start).Round(10 * time.Millisecond)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	found := panErrors.FindStringSubmatch(out)
	if found == nil {
		fmt.Print(out)
		return fmt.Errorf("%s: pan printed no error count", name)
	}
	states := "?"
	if s := panStates.FindStringSubmatch(out); s != nil {
		states = s[1]
	}
	errCount := found[1]
	switch {
	case bug == "" && errCount == "0" && !strings.Contains(out, "Search not completed") && !strings.Contains(out, "max search depth too small"):
		fmt.Printf("models: %s holds (%s states, %v)\n", name, states, took)
		return nil
	case bug == "":
		fmt.Print(out)
		if errCount != "0" {
			fmt.Printf("counterexample (spin -t %s):\n", m.file)
			trail, _ := outputIn(tmp, "spin", "-t", m.file)
			fmt.Print(trail)
		}
		return fmt.Errorf("%s: the model should hold, pan found %s error(s) or did not finish its search", name, errCount)
	case errCount != "0":
		fmt.Printf("models: %s: seeded bug found as expected (%s states, %v)\n", name, states, took)
		return nil
	default:
		fmt.Print(out)
		return fmt.Errorf("%s: the seeded bug was not found: the model no longer catches it", name)
	}
}

// outputIn runs a command in dir quietly and returns its stdout and
// stderr together, echoing it and showing them when it fails or with -v.
func outputIn(dir, cmd string, args ...string) (string, error) {
	line := "(cd " + shellQuote(dir) + " && " + cmdline(cmd, args) + ")"
	if mg.Verbose() {
		fmt.Println("+ " + line)
	}
	var buf strings.Builder
	c := exec.Command(cmd, args...)
	c.Dir, c.Stdout, c.Stderr = dir, &buf, &buf
	err := c.Run()
	if err != nil || mg.Verbose() {
		if err != nil && !mg.Verbose() {
			fmt.Println("+ " + line)
		}
		fmt.Print(buf.String())
	}
	if err != nil {
		if sh.CmdRan(err) {
			return buf.String(), mg.Fatalf(sh.ExitStatus(err), "%s: exit code %d", line, sh.ExitStatus(err))
		}
		return buf.String(), fmt.Errorf("%s: %w", line, err)
	}
	return buf.String(), nil
}

// Chaos runs the randomized fault run (TestChaos*) of every module for $CHAOS_DURATION (5m) per backend.
func Chaos() error {
	d := os.Getenv("CHAOS_DURATION")
	if d == "" {
		d = defaultChaosTime
	}
	// The tests read the duration from the environment of the go command.
	if err := os.Setenv(chaosDurationEnv, d); err != nil {
		return err
	}
	fmt.Printf("chaos: each backend for %s (%s); every run ends with its summary\n", d, chaosDurationEnv)
	return eachModule("chaos", nil, func(m module) error {
		return runV("go", m.goC("test", "-race", "-count=1", "-timeout=0", "-run=^TestChaos", "-v", "./...")...)
	})
}

// Lockbench runs the cross-backend benchmark command with $LOCKBENCH_ARGS.
func Lockbench() error {
	root, err := workspaceRoot()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, lockbenchPkg)); err != nil {
		fmt.Printf("lockbench is not built yet: %s does not exist\n", lockbenchPkg)
		return fmt.Errorf("lockbench: %s: %w", lockbenchPkg, fs.ErrNotExist)
	}
	args, err := envArgs("LOCKBENCH_ARGS")
	if err != nil {
		return err
	}
	return runV("go", append([]string{"-C", display(root), "run", lockbenchPkg}, args...)...)
}

// Compose runs the brokers of docker-compose.yml for a laptop.
type Compose mg.Namespace

// Up starts RabbitMQ, three Redis masters and NATS, and waits until they are healthy.
func (Compose) Up() error {
	file, err := composePath()
	if err != nil {
		return err
	}
	if err := runV("docker", "compose", "-f", file, "up", "-d", "--wait"); err != nil {
		return err
	}
	fmt.Printf("brokers are up; to point the tests at them:\n%s\n", composeEnvExport)
	return nil
}

// Down stops the brokers of docker-compose.yml and removes their volumes.
func (Compose) Down() error {
	file, err := composePath()
	if err != nil {
		return err
	}
	return runV("docker", "compose", "-f", file, "down", "-v")
}

func composePath() (string, error) {
	root, err := workspaceRoot()
	if err != nil {
		return "", err
	}
	return display(filepath.Join(root, composeFile)), nil
}

// gofmt lists the Go files of the workspace modules that gofmt would change,
// magefile.go and mage.go included, testdata and vendor excluded.
func gofmt() error {
	mods, err := modules()
	if err != nil {
		return err
	}
	var files []string
	for _, m := range mods {
		got, err := goFiles(m.abs)
		if err != nil {
			return err
		}
		files = append(files, got...)
	}
	if len(files) == 0 {
		return nil
	}
	fmt.Printf("+ gofmt -l <the %d .go files of the %d modules>\n", len(files), len(mods))
	out, err := sh.Output("gofmt", append([]string{"-l"}, files...)...)
	if err != nil {
		return fmt.Errorf("gofmt: %w", err)
	}
	if out == "" {
		return nil
	}
	fmt.Printf("these files are not gofmt'ed (run gofmt -w on them):\n%s\n", out)
	if isCI() {
		if diff, _ := sh.Output("gofmt", append([]string{"-d"}, strings.Fields(out)...)...); diff != "" {
			fmt.Println(diff)
		}
	}
	return fmt.Errorf("gofmt: %d files not formatted", len(strings.Fields(out)))
}

// goFiles returns the .go files under dir, skipping testdata, vendor, hidden
// and _ directories, and nested modules (linted as modules of their own).
func goFiles(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == dir {
				return nil
			}
			name := d.Name()
			if name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			files = append(files, display(path))
		}
		return nil
	})
	return files, err
}

// lintWorkflows runs actionlint on the GitHub workflows.
func lintWorkflows() error {
	root, err := workspaceRoot()
	if err != nil {
		return err
	}
	var files []string
	for _, pat := range []string{"*.yml", "*.yaml"} {
		m, _ := filepath.Glob(filepath.Join(root, workflowsDir, pat))
		files = append(files, m...)
	}
	if len(files) == 0 {
		fmt.Printf("no workflows in %s: actionlint skipped\n", workflowsDir)
		return nil
	}
	for i := range files {
		files[i] = display(files[i])
	}
	return run("go", append([]string{"run", actionlint}, files...)...)
}

// lintScripts checks the syntax of the CI script.
func lintScripts() error {
	root, err := workspaceRoot()
	if err != nil {
		return err
	}
	script := filepath.Join(root, ciScript)
	if _, err := os.Stat(script); err != nil {
		return nil
	}
	return run("bash", "-n", display(script))
}

// A fuzzTarget is one Fuzz function of one package.
type fuzzTarget struct{ pkg, name string }

var fuzzName = regexp.MustCompile(`^Fuzz\w*$`)

// fuzzTargets lists the fuzz targets of a module with go test -list.
func fuzzTargets(m module) ([]fuzzTarget, error) {
	out, err := output("go", m.goC("test", "-list=^Fuzz", "./...")...)
	if err != nil {
		return nil, err
	}
	// go test -list prints a package's matching names, then "ok  <pkg> <time>".
	var targets []fuzzTarget
	var names []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		f := strings.Fields(line)
		switch {
		case fuzzName.MatchString(line):
			names = append(names, line)
		case len(f) >= 2 && f[0] == "ok":
			for _, n := range names {
				targets = append(targets, fuzzTarget{pkg: f[1], name: n})
			}
			names = nil
		default:
			names = nil
		}
	}
	if len(targets) == 0 && mg.Verbose() {
		fmt.Printf("%s: no fuzz targets\n", m.dir)
	}
	return targets, nil
}

// A module is one `use` of go.work.
type module struct {
	dir string // as given to go -C: relative to the current directory where possible
	abs string
}

// packages returns the pattern matching the module's packages from here: in a
// workspace, a relative pattern stops at nested modules.
func (m module) packages() string {
	return filepath.ToSlash(m.dir) + "/..."
}

// goC returns the go command's arguments to run args in the module.
func (m module) goC(args ...string) []string {
	return append([]string{"-C", m.dir}, args...)
}

var (
	modsOnce sync.Once
	mods     []module
	modsErr  error
)

// modules returns the workspace modules, in go.work order.
func modules() ([]module, error) {
	modsOnce.Do(func() {
		root, err := workspaceRoot()
		if err != nil {
			modsErr = err
			return
		}
		out, err := sh.Output("go", "work", "edit", "-json", filepath.Join(root, "go.work"))
		if err != nil {
			modsErr = fmt.Errorf("go work edit -json: %w", err)
			return
		}
		var work struct{ Use []struct{ DiskPath string } }
		if err := json.Unmarshal([]byte(out), &work); err != nil {
			modsErr = fmt.Errorf("go work edit -json: %w", err)
			return
		}
		for _, u := range work.Use {
			abs := u.DiskPath
			if !filepath.IsAbs(abs) {
				abs = filepath.Join(root, abs)
			}
			mods = append(mods, module{dir: display(abs), abs: abs})
		}
		if len(mods) == 0 {
			modsErr = errors.New("go.work uses no modules")
		}
	})
	return mods, modsErr
}

var (
	rootOnce sync.Once
	root     string
	rootErr  error
)

// workspaceRoot returns the directory of go.work.
func workspaceRoot() (string, error) {
	rootOnce.Do(func() {
		gowork, err := sh.Output("go", "env", "GOWORK")
		switch {
		case err != nil:
			rootErr = fmt.Errorf("go env GOWORK: %w", err)
		case gowork == "" || gowork == "off":
			rootErr = errors.New("not in a go.work workspace (go env GOWORK is empty or off)")
		default:
			root = filepath.Dir(gowork)
		}
	})
	return root, rootErr
}

// eachModule runs fn on every workspace module that has packages (built with
// tags), going on after a failure, and fails if any module failed.
func eachModule(what string, tags []string, fn func(module) error) error {
	mods, err := modules()
	if err != nil {
		return err
	}
	var failed []string
	var errs []error
	for _, m := range mods {
		pkgs, err := output("go", m.goC(append(append([]string{"list", "-e"}, tags...), "./...")...)...)
		if err != nil {
			failed = append(failed, m.dir)
			errs = append(errs, err)
			continue
		}
		if strings.TrimSpace(pkgs) == "" {
			if mg.Verbose() {
				fmt.Printf("%s: no packages, skipped\n", m.dir)
			}
			continue
		}
		if err := fn(m); err != nil {
			failed = append(failed, m.dir)
			errs = append(errs, err)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s failed in %s: %w", what, strings.Join(failed, ", "), errors.Join(errs...))
	}
	return nil
}

// runV echoes a command and runs it with its output streamed.
func runV(cmd string, args ...string) error {
	echo(cmd, args...)
	return exitErr(cmd, args, execCmd(os.Stdout, os.Stderr, cmd, args...))
}

// run echoes a command and runs it, showing its output only when it fails or
// with -v.
func run(cmd string, args ...string) error {
	echo(cmd, args...)
	if mg.Verbose() {
		return exitErr(cmd, args, execCmd(os.Stdout, os.Stderr, cmd, args...))
	}
	var buf strings.Builder
	err := execCmd(&buf, &buf, cmd, args...)
	if err != nil {
		fmt.Print(buf.String())
	}
	return exitErr(cmd, args, err)
}

// output runs a command quietly and returns its stdout, echoing it and
// showing its stderr when it fails or with -v.
func output(cmd string, args ...string) (string, error) {
	if mg.Verbose() {
		echo(cmd, args...)
	}
	var stdout, stderr strings.Builder
	err := execCmd(&stdout, &stderr, cmd, args...)
	if err != nil || mg.Verbose() {
		if err != nil && !mg.Verbose() {
			echo(cmd, args...)
		}
		fmt.Fprint(os.Stderr, stderr.String())
	}
	return stdout.String(), exitErr(cmd, args, err)
}

// execCmd runs cmd with exactly args. (sh.Exec would expand $NAME in them,
// which can change a regexp such as -run 'Test$1'.)
func execCmd(stdout, stderr io.Writer, cmd string, args ...string) error {
	c := exec.Command(cmd, args...)
	c.Stdout, c.Stderr, c.Stdin = stdout, stderr, os.Stdin
	return c.Run()
}

// exitErr turns a failed command into an error that makes mage exit with the
// command's exit code.
func exitErr(cmd string, args []string, err error) error {
	if err == nil {
		return nil
	}
	if sh.CmdRan(err) {
		return mg.Fatalf(sh.ExitStatus(err), "%s: exit code %d", cmdline(cmd, args), sh.ExitStatus(err))
	}
	return fmt.Errorf("%s: %w", cmdline(cmd, args), err)
}

func echo(cmd string, args ...string) {
	fmt.Println("+ " + cmdline(cmd, args))
}

// cmdline renders a command as a line to paste into a shell.
func cmdline(cmd string, args []string) string {
	words := make([]string, 0, len(args)+1)
	for _, w := range append([]string{cmd}, args...) {
		words = append(words, shellQuote(w))
	}
	return strings.Join(words, " ")
}

var shellSafe = regexp.MustCompile(`^[\w@%+=:,./-]+$`)

func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// display returns path relative to the current directory when it is inside
// it, for shorter command lines; else path.
func display(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	rel, err := filepath.Rel(wd, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return path
	}
	if rel == "." {
		return "."
	}
	return "." + string(filepath.Separator) + rel
}

func isCI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "0" && !strings.EqualFold(v, "false")
}

// envArgs splits the environment variable name into arguments as a shell
// would: blanks separate them, and '...', "..." and \ quote.
func envArgs(name string) ([]string, error) {
	args, err := splitArgs(os.Getenv(name))
	if err != nil {
		return nil, fmt.Errorf("$%s: %w", name, err)
	}
	return args, nil
}

func splitArgs(s string) ([]string, error) {
	var args []string
	var cur strings.Builder
	inWord := false
	var quote rune
	escaped := false
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case quote == '\'':
			if r == '\'' {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\\':
			escaped, inWord = true, true
		case quote == '"':
			if r == '"' {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t' || r == '\n':
			if inWord {
				args = append(args, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 || escaped {
		return nil, fmt.Errorf("unterminated quote or escape in %q", s)
	}
	if inWord {
		args = append(args, cur.String())
	}
	return args, nil
}

// printBrokerVersions says which broker versions the tests will find: the
// embedded NATS server, the nats-server and redis-server programs the tests
// start, and the RabbitMQ broker they use. What it cannot learn it says so;
// the tests themselves decide whether a missing broker fails the run.
func printBrokerVersions() {
	fmt.Println("brokers this run tests:")
	if v, err := output("go", "-C", "contracttest/testenv/natsenv", "list", "-m", "-f", "{{.Version}}", "github.com/nats-io/nats-server/v2"); err == nil {
		fmt.Printf("  NATS, embedded: nats-server %s\n", strings.TrimSpace(v))
	}
	for _, prog := range []string{"nats-server", "redis-server"} {
		if _, err := exec.LookPath(prog); err != nil {
			fmt.Printf("  %s: not on PATH\n", prog)
			continue
		}
		v, _ := output(prog, "--version")
		fmt.Printf("  %s\n", strings.TrimSpace(v))
	}
	addr := "127.0.0.1:5672"
	if u, err := url.Parse(os.Getenv("LOCKS_AMQP_URL")); err == nil && u.Host != "" {
		addr = u.Host
	}
	v, err := rabbitVersion(addr)
	if err != nil {
		fmt.Printf("  RabbitMQ on %s: %v\n", addr, err)
		return
	}
	fmt.Printf("  RabbitMQ on %s: %s\n", addr, v)
}

// rabbitVersion reads the "version" server property from the
// connection.start frame an AMQP 0-9-1 broker on addr sends first.
func rabbitVersion(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		return "", err
	}
	var hdr [7]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return "", fmt.Errorf("no AMQP reply: %w", err)
	}
	frame := make([]byte, min(binary.BigEndian.Uint32(hdr[3:]), 1<<16))
	if _, err := io.ReadFull(c, frame); err != nil {
		return "", fmt.Errorf("short AMQP reply: %w", err)
	}
	// The property table holds the field "version" as a long string:
	// name length, name, 'S', a 4-byte length, the value.
	key := []byte("\x07versionS")
	i := bytes.Index(frame, key)
	if i < 0 || i+len(key)+4 > len(frame) {
		return "", errors.New("the broker names no version")
	}
	rest := frame[i+len(key):]
	n := int(binary.BigEndian.Uint32(rest))
	if 4+n > len(rest) {
		return "", errors.New("a malformed version property")
	}
	return string(rest[4 : 4+n]), nil
}
