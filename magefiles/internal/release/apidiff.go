package release

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// APIDiff reports the changes of m's exported API from the tag prevTag to
// the work tree, with the apidiff program at apidiff
// (golang.org/x/exp/cmd/apidiff): package by package, each side loaded in
// its own tree's workspace, so that it sees the siblings as they were. It
// returns "" when nothing changed. Commands (package main) and internal
// packages have no API and are left out.
func APIDiff(ctx context.Context, ws *Workspace, m *Module, prevTag, apidiff string) (string, error) {
	old, err := os.MkdirTemp("", "latchkey-apidiff-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(old)
	if err := extractTag(ctx, ws.Root, prevTag, old); err != nil {
		return "", err
	}
	oldDir := filepath.Join(old, filepath.FromSlash(m.Dir))
	newDir := filepath.Join(ws.Root, filepath.FromSlash(m.Dir))
	oldPkgs, err := apiPackages(ctx, oldDir)
	if err != nil {
		return "", fmt.Errorf("%s at %s: %w", m.Dir, prevTag, err)
	}
	newPkgs, err := apiPackages(ctx, newDir)
	if err != nil {
		return "", fmt.Errorf("%s: %w", m.Dir, err)
	}
	var b strings.Builder
	for i, pkg := range oldPkgs {
		if !slices.Contains(newPkgs, pkg) {
			fmt.Fprintf(&b, "package %s: removed (incompatible)\n", pkg)
			continue
		}
		exp := filepath.Join(old, fmt.Sprintf("api-%d.export", i))
		if _, err := runIn(ctx, oldDir, apidiff, "-w", exp, pkg); err != nil {
			return "", err
		}
		out, err := runIn(ctx, newDir, apidiff, exp, pkg)
		if err != nil {
			return "", err
		}
		if out = strings.TrimSpace(out); out != "" {
			fmt.Fprintf(&b, "package %s:\n%s\n", pkg, indent(out))
		}
	}
	for _, pkg := range newPkgs {
		if !slices.Contains(oldPkgs, pkg) {
			fmt.Fprintf(&b, "package %s: added (compatible)\n", pkg)
		}
	}
	return b.String(), nil
}

// apiPackages lists the import paths of the module in dir's packages that
// have an API: not commands, not internal.
func apiPackages(ctx context.Context, dir string) ([]string, error) {
	out, err := runIn(ctx, dir, "go", "list", "-f", "{{.Name}} {{.ImportPath}}", "./...")
	if err != nil {
		return nil, err
	}
	var pkgs []string
	for _, line := range strings.Split(out, "\n") {
		name, path, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || name == "main" || strings.Contains(path+"/", "/internal/") {
			continue
		}
		pkgs = append(pkgs, path)
	}
	return pkgs, nil
}

// extractTag writes the tree of the repository at root as of tag into dir.
func extractTag(ctx context.Context, root, tag, dir string) error {
	cmd := exec.CommandContext(ctx, "git", "archive", "--format=tar", tag)
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	untarErr := untar(stdout, dir)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w\n%s", tag, err, indent(stderr.String()))
	}
	return untarErr
}

func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		target := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(target, filepath.Clean(dir)+string(filepath.Separator)) {
			return fmt.Errorf("git archive: %q leaves the directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, 0o755)
		case tar.TypeReg:
			err = writeFrom(tr, target, os.FileMode(h.Mode)&0o777)
		}
		if err != nil {
			return err
		}
	}
}

func writeFrom(r io.Reader, target string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode|0o200)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// runIn runs a program in dir and returns its stdout; on failure the error
// holds everything it printed.
func runIn(ctx context.Context, dir, prog string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Dir = dir
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("(cd %s && %s %s): %w\n%s", dir, filepath.Base(prog), strings.Join(args, " "), err,
			indent(stdout.String()+stderr.String()))
	}
	return stdout.String(), nil
}
