package release

import (
	"fmt"
	"strings"
)

// CheckConsumer checks what a user of c.Library gets: c's module graph
// (go list -m all) must hold the library at version, and no test-only
// module, no other broker's client and no module of this repository but
// the library and the client-free libraries (locks) — unless the
// library's own broker client brings it (amqp091-go requires goleak), which
// the library cannot help. Each problem shows the requirement chain that
// brings the module in.
func CheckConsumer(ws *Workspace, c *Consumer, version string) []Problem {
	p := ws.Policy
	lib := c.Library
	who := lib.Dir + " consumer"
	var out []Problem
	add := func(format string, args ...any) {
		out = append(out, Problem{Module: who, Msg: fmt.Sprintf(format, args...)})
	}
	fromClient := reachable(c.Graph, lib.Role.Client, p.isSibling)
	found := false
	for _, m := range c.Modules {
		if m.Path == lib.Path {
			found = true
			if m.Version != version {
				add("go list -m all has %s %s, not the candidate %s", p.short(m.Path), m.Version, version)
			}
			continue
		}
		var what string
		switch {
		case p.isSibling(m.Path):
			what = siblingFault(ws, lib, m.Path)
		case fromClient[m.Path]:
			continue
		case p.testOnly(m.Path):
			what = "a test-only module"
		case p.otherClient(m.Path, lib.Role.Client):
			what = "another broker's client"
		}
		if what != "" {
			add("holds %s %s, %s: %s", m.Path, m.Version, what, c.chain(p, m.Path))
		}
	}
	if !found {
		add("go list -m all does not hold %s", lib.Path)
	}
	return out
}

// siblingFault says what is wrong with a consumer of lib holding the
// sibling modPath, or "" if nothing is.
func siblingFault(ws *Workspace, lib *Module, modPath string) string {
	s := ws.Module(modPath)
	switch {
	case s == nil:
		return "not a go.work module"
	case s.Role.Kind == Support:
		return "a support module for tests"
	case s.Role.Kind == Unreleased:
		return "a module that is never released"
	case s.Role.Client != "" && s.Role.Client != lib.Role.Client:
		return "another backend"
	}
	return ""
}

// reachable returns the module paths reachable in g from the nodes of
// module client (any version), not passing through the modules skip
// selects; nil when client is "".
func reachable(g map[string][]string, client string, skip func(string) bool) map[string]bool {
	seen := map[string]bool{}
	if client == "" {
		return seen
	}
	var queue []string
	for from, tos := range g {
		for _, n := range append([]string{from}, tos...) {
			if nodePath(n) == client {
				queue = append(queue, n)
			}
		}
	}
	visited := map[string]bool{}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if visited[n] || skip(nodePath(n)) {
			continue
		}
		visited[n] = true
		seen[nodePath(n)] = true
		queue = append(queue, g[n]...)
	}
	return seen
}

// chain returns the shortest requirement chain from the consumer to a
// node of modPath, rendered "consumer → natsputex@v… → …".
func (c *Consumer) chain(p Policy, modPath string) string {
	prev := map[string]string{c.Path: ""}
	queue := []string{c.Path}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if nodePath(n) == modPath {
			var names []string
			for ; n != c.Path; n = prev[n] {
				names = append([]string{p.short(nodePath(n)) + "@" + nodeVersion(n)}, names...)
			}
			return "required by consumer → " + strings.Join(names, " → ")
		}
		for _, next := range c.Graph[n] {
			if _, ok := prev[next]; !ok {
				prev[next] = n
				queue = append(queue, next)
			}
		}
	}
	return "(no requirement chain in go mod graph)"
}

func nodePath(n string) string {
	path, _, _ := strings.Cut(n, "@")
	return path
}

func nodeVersion(n string) string {
	_, v, _ := strings.Cut(n, "@")
	return v
}
