//go:build mage

package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/magefile/mage/sh"
)

const (
	workflowsDir = ".github/workflows"
	ciScript     = ".ci/run"
	lintTags     = "-tags=mage" // so vet and staticcheck see the magefiles too
)

// Lint runs gofmt, go vet, staticcheck, actionlint and Docs, and reports every finding.
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
	errs = append(errs, lintWorkflows(), lintScripts(), lintBrokerDeps(), Docs())
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
		// The fencing guards (issue 29): each guard with its own client.
		"fence":            "",
		"fence/redisfence": "github.com/redis/go-redis/v9",
		"fence/natsfence":  "github.com/nats-io/nats.go",
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

// gofmt lists the Go files of the workspace modules that gofmt would change,
// the magefiles and mage.go included, testdata and vendor excluded.
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
