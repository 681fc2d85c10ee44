package release

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

// Pack writes every released module of ws at version into proxyDir, laid
// out as a module proxy that GOPROXY=file://proxyDir serves: for each
// module, <path>/@v/list, <version>.info, <version>.mod and <version>.zip.
// Each packed go.mod (the .mod file and the one in the zip) has its
// requirements on released siblings set to version; the rest of the module
// is the working tree as it is, nested modules left out.
func Pack(ws *Workspace, version, proxyDir string) error {
	if !semver.IsValid(version) {
		return fmt.Errorf("pack: %q is not a semantic version", version)
	}
	now := time.Now()
	for _, m := range ws.Released() {
		gomod, _, err := PinSiblings(ws, m, version)
		if err != nil {
			return fmt.Errorf("pack %s: %w", m.Dir, err)
		}
		src := filepath.Join(ws.Root, filepath.FromSlash(m.Dir))
		if err := PackDir(proxyDir, src, m.Path, version, gomod, now); err != nil {
			return fmt.Errorf("pack %s: %w", m.Dir, err)
		}
	}
	return nil
}

// PackDir writes the module in dir, with path modPath and the go.mod
// contents gomod, into proxyDir at version, dated t.
func PackDir(proxyDir, dir, modPath, version string, gomod []byte, t time.Time) error {
	escPath, err := module.EscapePath(modPath)
	if err != nil {
		return err
	}
	escVersion, err := module.EscapeVersion(version)
	if err != nil {
		return err
	}
	vdir := filepath.Join(proxyDir, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	stage, err := os.MkdirTemp("", "latchkey-pack-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	if err := copyModuleTree(dir, stage); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(stage, "go.mod"), gomod, 0o644); err != nil {
		return err
	}
	var zipBuf bytes.Buffer
	if err := modzip.CreateFromDir(&zipBuf, module.Version{Path: modPath, Version: version}, stage); err != nil {
		return err
	}
	info, err := json.Marshal(struct{ Version, Time string }{version, t.UTC().Format(time.RFC3339)})
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		escVersion + ".zip":  zipBuf.Bytes(),
		escVersion + ".mod":  gomod,
		escVersion + ".info": info,
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return err
		}
	}
	return addToList(filepath.Join(vdir, "list"), version)
}

// addToList adds version to a proxy's list file, one version a line.
func addToList(file, version string) error {
	data, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	versions := strings.Fields(string(data))
	if slices.Contains(versions, version) {
		return nil
	}
	versions = append(versions, version)
	semver.Sort(versions)
	return os.WriteFile(file, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

// copyModuleTree copies the regular files of the module in src to dst,
// leaving out nested modules and version control directories, as a module
// zip does.
func copyModuleTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			if p == src {
				return nil
			}
			switch d.Name() {
			case ".git", ".hg", ".svn", ".bzr":
				return filepath.SkipDir
			}
			if _, err := os.Lstat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return copyFile(p, target)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
