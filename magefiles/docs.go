//go:build mage

package main

import (
	"fmt"
	"strings"

	"github.com/latchkey-go/latchkey/magefiles/internal/doccheck"
)

// Docs checks that every test name, file path, doc link and Go identifier cited in the docs and comments exists.
func Docs() error {
	root, err := workspaceRoot()
	if err != nil {
		return err
	}
	found, err := doccheck.Check(root)
	if err != nil {
		return fmt.Errorf("docs: %w", err)
	}
	if len(found) == 0 {
		return nil
	}
	lines := make([]string, len(found))
	for i, f := range found {
		lines[i] = f.String()
	}
	return fmt.Errorf("docs: %d references point at nothing:\n%s", len(found), strings.Join(lines, "\n"))
}
