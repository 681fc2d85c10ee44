//go:build mage

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/magefile/mage/mg"
	"github.com/magefile/mage/sh"
)

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
