package release

import (
	"fmt"
	"strings"
)

// CheckConsumer checks what a user of c.Library gets: c's module graph
// (go list -m all) must hold the library at version, the client-free
// libraries of this repository (locks), the library's broker client and
// what that client requires, and the modules the library's Role.Allow
// names — nothing else. A test-only module, another broker's client or
// another module of this repository is a problem of its own, with the
// requirement chain that brings it in; any other module is listed in one
// problem. What the library's own client brings is never a problem, test
// modules included (amqp091-go requires goleak): the library cannot help it.
func CheckConsumer(ws *Workspace, c *Consumer, version string) []Problem {
	p := ws.Policy
	lib := c.Library
	who := lib.Dir + " consumer"
	var out []Problem
	add := func(fix, format string, args ...any) {
		out = append(out, Problem{Module: who, Msg: fmt.Sprintf(format, args...), Fix: fix})
	}
	fromClient := reachable(c.Graph, lib.Role.Client, p.isSibling)
	found := false
	var extra []string
	for _, m := range c.Modules {
		if m.Path == lib.Path {
			found = true
			if m.Version != version {
				add("", "go list -m all has %s %s, not the candidate %s", p.short(m.Path), m.Version, version)
			}
			continue
		}
		var what, fix string
		switch {
		case p.isSibling(m.Path):
			what, fix = siblingFault(ws, lib, m.Path)
		case fromClient[m.Path]:
			continue
		case p.testOnly(m.Path):
			what, fix = "a test-only module", fixTestOnly
		case p.otherClient(m.Path, lib.Role.Client):
			what, fix = "another broker's client", fixClient
		case !matchAny(m.Path, lib.Role.Allow):
			extra = append(extra, m.Path+" "+m.Version)
		}
		if what != "" {
			add(fix, "holds %s %s: %s, %s", m.Path, m.Version, what, c.chain(p, m.Path))
		}
	}
	if !found {
		add("", "go list -m all does not hold %s", lib.Path)
	}
	if len(extra) > 0 {
		add(fixLean, "holds %d more module(s) %s: %s", len(extra), beyond(lib), strings.Join(extra, ", "))
	}
	return out
}

// beyond says what a library's graph may hold besides its siblings.
func beyond(lib *Module) string {
	if lib.Role.Client == "" {
		return "although " + lib.Dir + " has no broker client"
	}
	return "that its broker client " + lib.Role.Client + " does not bring"
}

// reachable returns the module paths reachable in g from module client,
// not passing through the modules skip selects; empty when client is "".
// It works on paths, not versions: a module the client requires brings
// what that module requires at the version the graph selected, which may
// be above the one the client names (the library may require a newer
// golang.org/x/crypto than nats.go does), and a pruned graph lists only
// the selected version's requirements.
func reachable(g map[string][]string, client string, skip func(string) bool) map[string]bool {
	seen := map[string]bool{}
	if client == "" {
		return seen
	}
	edges := map[string][]string{} // path -> paths it requires, any version
	for from, tos := range g {
		for _, to := range tos {
			edges[nodePath(from)] = append(edges[nodePath(from)], nodePath(to))
		}
	}
	queue := []string{client}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] || skip(p) {
			continue
		}
		seen[p] = true
		queue = append(queue, edges[p]...)
	}
	return seen
}

// chain says how the consumer comes to hold modPath: the shortest
// requirement chain from the library in go mod graph, "via natsputex@v… →
// contracttest@v… → …". When the graph has none (the consumer's own go mod
// tidy listed the module, because the library's go.mod lacks it), it gives
// the import chain of go mod why -m instead.
func (c *Consumer) chain(p Policy, modPath string) string {
	start := c.Library.Path + "@" + c.version()
	prev := map[string]string{start: ""}
	queue := []string{start}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if nodePath(n) == modPath {
			var names []string
			for ; n != ""; n = prev[n] {
				names = append([]string{p.short(nodePath(n)) + "@" + nodeVersion(n)}, names...)
			}
			return "via " + strings.Join(names, " → ")
		}
		for _, next := range c.Graph[n] {
			if _, ok := prev[next]; !ok {
				prev[next] = n
				queue = append(queue, next)
			}
		}
	}
	if c.why != nil {
		if imports := c.why(modPath); len(imports) > 0 {
			for i, pkg := range imports {
				imports[i] = p.short(pkg)
			}
			return "listed by the consumer's go mod tidy for the imports " + strings.Join(imports, " → ")
		}
	}
	return "listed by the consumer's go mod tidy"
}

// version returns the library's version in the consumer's graph.
func (c *Consumer) version() string {
	for _, m := range c.Modules {
		if m.Path == c.Library.Path {
			return m.Version
		}
	}
	return ""
}

func nodePath(n string) string {
	path, _, _ := strings.Cut(n, "@")
	return path
}

func nodeVersion(n string) string {
	_, v, _ := strings.Cut(n, "@")
	return v
}

// siblingFault says what is wrong with a consumer of lib holding the
// sibling modPath, and how to fix it; "" if nothing is.
func siblingFault(ws *Workspace, lib *Module, modPath string) (what, fix string) {
	s := ws.Module(modPath)
	switch {
	case s == nil:
		return "not a go.work module", fixSibling
	case s.Role.Kind == Support:
		return "a support module for tests", fixTestOnly
	case s.Role.Kind == Unreleased:
		return "a module that is never released", fixSibling
	case s.Role.Client != "" && s.Role.Client != lib.Role.Client:
		return "another backend", fixClient
	}
	return "", ""
}
