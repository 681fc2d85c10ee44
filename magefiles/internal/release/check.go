package release

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// CheckOptions configures [Check].
type CheckOptions struct {
	// Version is the candidate version the modules are packed at, e.g.
	// v0.0.0-candidate.
	Version string
	// Templates holds one consumer per library: Templates/<dir>/main.go, a
	// tiny program that uses the library as its example does.
	Templates string
	// WorkDir is a scratch directory for the proxy, the consumers and
	// their module cache.
	WorkDir string
	// Env is how consumers reach modules; Check sets its ProxyDir and
	// ModCache under WorkDir.
	Env ConsumerEnv
	// Run runs each consumer program (against the real brokers).
	Run bool
	// Log receives progress: each consumer's graph and output.
	Log io.Writer
}

// Check checks that the released modules work for a user outside the
// workspace: the go.mod rules of [CheckGoMods]; then it packs every
// released module at opts.Version into a file proxy, builds a consumer of
// each library from it ([BuildConsumer]), checks each consumer's graph
// ([CheckConsumer]) and, with opts.Run, runs it. It goes on after a problem
// and returns them all as a *[ProblemsError], or nil.
func Check(ctx context.Context, ws *Workspace, opts CheckOptions) error {
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	problems := CheckGoMods(ws)
	fmt.Fprintf(log, "releaseCheck: go.mod rules: %d problem(s)\n", len(problems))
	env := opts.Env
	env.ProxyDir = filepath.Join(opts.WorkDir, "proxy")
	env.ModCache = filepath.Join(opts.WorkDir, "modcache")
	if err := Pack(ws, opts.Version, env.ProxyDir); err != nil {
		return err
	}
	fmt.Fprintf(log, "releaseCheck: packed %s at %s into %s\n", names(ws.Released()), opts.Version, env.ProxyDir)
	order, err := ws.Order()
	if err != nil {
		return err
	}
	for _, lib := range order {
		if lib.Role.Kind != Library {
			continue
		}
		problems = append(problems, checkLibrary(ctx, ws, lib, opts, env, log)...)
	}
	return AsError("releaseCheck", problems)
}

// checkLibrary builds, checks and (with opts.Run) runs the consumer of lib.
func checkLibrary(ctx context.Context, ws *Workspace, lib *Module, opts CheckOptions, env ConsumerEnv, log io.Writer) []Problem {
	who := lib.Dir + " consumer"
	template := filepath.Join(opts.Templates, filepath.FromSlash(lib.Dir))
	if _, err := os.Stat(filepath.Join(template, "main.go")); err != nil {
		return []Problem{{Module: who, Msg: fmt.Sprintf("no consumer template: %v", err)}}
	}
	dir := filepath.Join(opts.WorkDir, "consumers", strings.ReplaceAll(lib.Dir, "/", "-"))
	fmt.Fprintf(log, "releaseCheck: %s: go get %s@%s in %s\n", who, lib.Path, opts.Version, dir)
	c, err := BuildConsumer(ctx, lib, opts.Version, template, dir, env)
	var problems []Problem
	if err != nil {
		problems = append(problems, Problem{Module: who, Msg: "build failed: " + err.Error()})
		if c == nil || c.Graph == nil {
			return problems
		}
	}
	fmt.Fprintf(log, "releaseCheck: %s: go list -m all holds %d module(s) besides itself:\n", who, len(c.Modules))
	for _, m := range c.Modules {
		fmt.Fprintf(log, "    %s %s\n", m.Path, m.Version)
	}
	problems = append(problems, CheckConsumer(ws, c, opts.Version)...)
	if opts.Run && err == nil {
		out, err := c.Run(ctx, env)
		if err != nil {
			problems = append(problems, Problem{Module: who, Msg: err.Error()})
		} else {
			fmt.Fprintf(log, "releaseCheck: %s ran:\n%s\n", who, indent(out))
		}
	}
	return problems
}

func names(mods []*Module) string {
	var s []string
	for _, m := range mods {
		s = append(s, m.Dir)
	}
	return strings.Join(s, ", ")
}
