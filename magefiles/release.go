//go:build mage

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/magefile/mage/sh"

	"github.com/latchkey-go/latchkey/magefiles/internal/release"
)

// Releases (docs/versioning.md): every released module is tagged
// <dir>/VERSION at one commit, its requirements on its siblings set to
// VERSION. The logic is in ./release; these targets drive it.
//
// Environment:
//
//	RELEASE_DRY_RUN=1     release does a dry run (as releaseDryRun)
//	RELEASE_SKIP_CHECK=1  release skips lint, models, tests and releaseCheck (for dry runs)
//	RELEASE_CANDIDATE     the version releaseCheck packs the modules at (default v0.0.0-candidate)
//	RELEASE_KEEP=1        keep releaseCheck's and releaseDryRun's scratch directories
const (
	rootModulePath    = "github.com/latchkey-go/latchkey"
	apidiffTool       = "golang.org/x/exp/cmd/apidiff@v0.0.0-20261113113407-e3970619a1a4"
	changelogFile     = "CHANGELOG.md"
	consumerTemplates = "magefiles/internal/release/testdata/consumers"
	defaultCandidate  = "v0.0.0-candidate"
	consumerRunLimit  = time.Minute
)

// releasePolicy says what each go.work module is. A module missing here
// fails every release target, so that none is released, or left out, by
// accident.
var releasePolicy = release.Policy{
	RootPath: rootModulePath,
	Roles: map[string]release.Role{
		".":                            {Kind: release.Unreleased, Why: "the build module: mage targets and release tooling"},
		"benchmarks":                   {Kind: release.Unreleased, Why: "benchmarks against peers: requires every backend and the peers' libraries"},
		"locks":                        {Kind: release.Library, Client: ownClient["locks"], Why: "the contract"},
		"natsputex":                    {Kind: release.Library, Client: ownClient["natsputex"], Why: "NATS backend"},
		"amqpsem":                      {Kind: release.Library, Client: ownClient["amqpsem"], Why: "RabbitMQ backend"},
		"redlockprio":                  {Kind: release.Library, Client: ownClient["redlockprio"], Why: "Redis backend"},
		"contracttest":                 {Kind: release.Support, Why: "the conformance suite, for backend authors"},
		"contracttest/testenv/natsenv": {Kind: release.Support, Why: "embedded NATS servers for the suite"},
		"lockotel": {Kind: release.Library, Client: "go.opentelemetry.io/otel", Why: "OpenTelemetry around any backend",
			Allow: []string{"go.opentelemetry.io/otel/metric", "go.opentelemetry.io/otel/trace"}},
		"natsputex/cmd/natslock":     {Kind: release.Support, Why: "the natslock command (go install)"},
		"amqpsem/cmd/amqpsem":        {Kind: release.Support, Why: "the amqpsem command (go install)"},
		"redlockprio/cmd/redlockrun": {Kind: release.Support, Why: "the redlockrun command (go install)"},
		"natsputex/tests":            {Kind: release.Unreleased, Why: "natsputex's tests that need test-only modules"},
		"amqpsem/tests":              {Kind: release.Unreleased, Why: "amqpsem's tests that need test-only modules"},
		"redlockprio/tests":          {Kind: release.Unreleased, Why: "redlockprio's tests that need test-only modules"},
		"lockotel/tests":             {Kind: release.Unreleased, Why: "lockotel's tests: the OpenTelemetry SDK and every backend"},
		"fence":                      {Kind: release.Library, Client: ownClient["fence"], Why: "fencing guards: the core and database/sql (issue 29)"},
		"fence/redisfence":           {Kind: release.Library, Client: ownClient["fence/redisfence"], Why: "the Redis fencing guard"},
		"fence/natsfence":            {Kind: release.Library, Client: ownClient["fence/natsfence"], Why: "the NATS KV fencing guard"},
		"fence/tests":                {Kind: release.Unreleased, Why: "fence's tests: database drivers, brokers and the contract suite"},
	},
	// Modules only tests need: a user of a backend must never get them
	// (unless its own broker client requires them: amqp091-go requires goleak).
	TestOnly: []string{
		"github.com/ory/dockertest", "github.com/docker", "github.com/moby", "github.com/containerd",
		"github.com/opencontainers", "github.com/testcontainers",
		"github.com/nats-io/nats-server", "github.com/anishathalye/porcupine", "go.uber.org/goleak",
		"github.com/Shopify/toxiproxy", "github.com/alicebob/miniredis", "github.com/stretchr/testify",
	},
	Clients: []string{"github.com/nats-io/nats.go", "github.com/rabbitmq/amqp091-go", "github.com/redis/go-redis/v9"},
}

// ReleaseCheck packs the released modules into a local module proxy and builds, checks and runs a consumer of each backend outside the workspace.
func ReleaseCheck() error {
	ws, err := releaseWorkspace()
	if err != nil {
		return err
	}
	work, err := scratchDir("latchkey-releasecheck-")
	if err != nil {
		return err
	}
	defer removeScratch(work)
	fallback, err := fallbackProxy()
	if err != nil {
		return err
	}
	candidate := os.Getenv("RELEASE_CANDIDATE")
	if candidate == "" {
		candidate = defaultCandidate
	}
	err = release.Check(context.Background(), ws, release.CheckOptions{
		Version:   candidate,
		Templates: filepath.Join(ws.Root, consumerTemplates),
		WorkDir:   work,
		Env:       release.ConsumerEnv{Fallback: fallback, NoSumDB: rootModulePath, RunTimeout: consumerRunLimit},
		Run:       true,
		Log:       os.Stdout,
	})
	if err != nil {
		return fmt.Errorf("releaseCheck failed: %w", err)
	}
	fmt.Println("releaseCheck: passed")
	return nil
}

// Release releases VERSION (like v0.2.0): on a clean tree that passes check, it commits the sibling requirements at VERSION and the CHANGELOG entry, then tags each released module <dir>/VERSION in dependency order.
func Release(version string) error {
	if envSet("RELEASE_DRY_RUN") {
		return ReleaseDryRun(version)
	}
	ctx := context.Background()
	ws, err := releaseWorkspace()
	if err != nil {
		return err
	}
	git := release.Git{Dir: ws.Root}
	if err := git.CleanTree(ctx); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	tags, err := git.Tags(ctx)
	if err != nil {
		return err
	}
	plan, err := release.NewPlan(ws, version, tags)
	if err != nil {
		return err
	}
	plan.Print(os.Stdout, ws)
	if err := releaseChecks(); err != nil {
		return err
	}
	if err := git.CleanTree(ctx); err != nil {
		return fmt.Errorf("release: the checks changed the tree: %w", err)
	}
	printAPIDiffs(ctx, ws, plan)
	made, err := release.Cut(ctx, ws, plan, changelogFile, time.Now())
	if err != nil {
		return err
	}
	head, _ := git.Run(ctx, "rev-parse", "--short", "HEAD")
	fmt.Printf("release %s: commit %s, tags in order:\n  %s\n", version, strings.TrimSpace(head), strings.Join(made, "\n  "))
	fmt.Printf("nothing is pushed; to publish, push the commit, then the tags in this order:\n  git push origin HEAD %s\n",
		strings.Join(made, " "))
	return nil
}

// ReleaseDryRun does release VERSION in a scratch clone of HEAD and prints the commit and the tags it made; this tree is left alone.
func ReleaseDryRun(version string) error {
	ctx := context.Background()
	root, err := workspaceRoot()
	if err != nil {
		return err
	}
	src := release.Git{Dir: root}
	if src.CleanTree(ctx) != nil {
		fmt.Println("releaseDryRun: this tree has uncommitted changes; the dry run clones HEAD without them")
	}
	head, err := src.Run(ctx, "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	scratch, err := scratchDir("latchkey-release-dry-run-")
	if err != nil {
		return err
	}
	defer removeScratch(scratch)
	clone := filepath.Join(scratch, "latchkey")
	if err := run("git", "clone", "-q", "--no-checkout", root, clone); err != nil {
		return err
	}
	dst := release.Git{Dir: clone}
	if _, err := dst.Run(ctx, "checkout", "-q", "-B", "release-dry-run", strings.TrimSpace(head)); err != nil {
		return err
	}
	fmt.Printf("releaseDryRun: release %s in the scratch clone %s\n", version, clone)
	cmd := exec.Command("go", "run", "mage.go", "release", version)
	cmd.Dir, cmd.Stdout, cmd.Stderr = clone, os.Stdout, os.Stderr
	cmd.Env = withoutEnv(os.Environ(), "RELEASE_DRY_RUN", "GOWORK")
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("releaseDryRun: release %s failed in the scratch clone: %w", version, err)
	}
	made, err := dst.Run(ctx, "tag", "--points-at", "HEAD")
	if err != nil {
		return err
	}
	stat, _ := dst.Run(ctx, "show", "--stat", "--format=%h %s", "HEAD")
	fmt.Printf("releaseDryRun: the release commit:\n%s\nreleaseDryRun: tags it would make, in order:\n  %s\n",
		strings.TrimSpace(stat), strings.Join(inReleaseOrder(strings.Fields(made), version), "\n  "))
	return nil
}

// inReleaseOrder returns tags sorted in the order release makes them
// (this tree's dependency order), unknown tags last.
func inReleaseOrder(tags []string, version string) []string {
	ws, err := releaseWorkspace()
	if err != nil {
		return tags
	}
	order, err := ws.Order()
	if err != nil {
		return tags
	}
	var sorted, rest []string
	for _, m := range order {
		if slices.Contains(tags, m.Tag(version)) {
			sorted = append(sorted, m.Tag(version))
		}
	}
	for _, t := range tags {
		if !slices.Contains(sorted, t) {
			rest = append(rest, t)
		}
	}
	return append(sorted, rest...)
}

// releaseWorkspace loads the go.work modules with their roles.
func releaseWorkspace() (*release.Workspace, error) {
	root, err := workspaceRoot()
	if err != nil {
		return nil, err
	}
	mods, err := modules()
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, m := range mods {
		dirs = append(dirs, m.abs)
	}
	return release.Load(root, dirs, releasePolicy)
}

// releaseChecks runs what release needs to pass, unless
// RELEASE_SKIP_CHECK is set.
func releaseChecks() error {
	if envSet("RELEASE_SKIP_CHECK") {
		fmt.Println("release: RELEASE_SKIP_CHECK is set: lint, models, tests and releaseCheck skipped")
		return nil
	}
	for _, check := range []struct {
		name string
		fn   func() error
	}{{"lint", Lint}, {"models", Models}, {"test", Test}, {"releaseCheck", ReleaseCheck}} {
		fmt.Printf("release: %s\n", check.name)
		if err := check.fn(); err != nil {
			return fmt.Errorf("release: %s failed, nothing committed or tagged: %w", check.name, err)
		}
	}
	return nil
}

// printAPIDiffs prints each released module's API changes since its
// previous tag, with apidiff. It only informs: v0 allows breaking changes,
// which the CHANGELOG must list.
func printAPIDiffs(ctx context.Context, ws *release.Workspace, plan *release.Plan) {
	var bin string
	for _, m := range plan.Order {
		if plan.Previous[m.Dir] != "" && bin == "" {
			var err error
			if bin, err = installAPIDiff(); err != nil {
				fmt.Printf("api: cannot install apidiff, no API comparison: %v\n", err)
				return
			}
		}
	}
	if bin != "" {
		defer os.RemoveAll(filepath.Dir(bin))
	}
	for _, m := range plan.Order {
		prev := plan.Previous[m.Dir]
		if prev == "" {
			fmt.Printf("api %s: no previous tag (%s/v*): first release, no API comparison\n", m.Dir, m.Dir)
			continue
		}
		diff, err := release.APIDiff(ctx, ws, m, m.Tag(prev), bin)
		switch {
		case err != nil:
			fmt.Printf("api %s: the comparison with %s failed: %v\n", m.Dir, m.Tag(prev), err)
		case diff == "":
			fmt.Printf("api %s: no API changes since %s\n", m.Dir, m.Tag(prev))
		default:
			fmt.Printf("api %s: changes since %s:\n%s", m.Dir, m.Tag(prev), diff)
		}
	}
}

// installAPIDiff builds the pinned apidiff into a temporary directory and
// returns its path.
func installAPIDiff() (string, error) {
	dir, err := os.MkdirTemp("", "latchkey-apidiff-bin-")
	if err != nil {
		return "", err
	}
	echo("go", "install", apidiffTool)
	if _, err := sh.OutputWith(map[string]string{"GOBIN": dir, "GOWORK": "off"}, "go", "install", apidiffTool); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return filepath.Join(dir, "apidiff"), nil
}

// fallbackProxy is the GOPROXY a consumer uses after the packed modules:
// this machine's module cache, then the go command's usual GOPROXY.
func fallbackProxy() (string, error) {
	out, err := output("go", "env", "GOMODCACHE", "GOPROXY")
	if err != nil {
		return "", err
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		return "", errors.New("go env GOMODCACHE GOPROXY: unexpected output " + out)
	}
	return "file://" + filepath.ToSlash(filepath.Join(f[0], "cache", "download")) + "," + f[1], nil
}

// scratchDir makes a temporary directory.
func scratchDir(prefix string) (string, error) {
	return os.MkdirTemp("", prefix)
}

// removeScratch removes dir, or says where it is with RELEASE_KEEP set.
func removeScratch(dir string) {
	if envSet("RELEASE_KEEP") {
		fmt.Printf("RELEASE_KEEP is set: %s is kept\n", dir)
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Printf("could not remove %s: %v\n", dir, err)
	}
}

// envSet reports whether the environment variable name is set to a true value.
func envSet(name string) bool {
	v := os.Getenv(name)
	return v != "" && v != "0" && !strings.EqualFold(v, "false")
}

// withoutEnv returns env without the variables names.
func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, n := range names {
			drop = drop || name == n
		}
		if !drop {
			out = append(out, kv)
		}
	}
	return out
}
