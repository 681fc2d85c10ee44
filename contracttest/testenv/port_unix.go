//go:build unix

package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// lockPort takes an exclusive lock on port p shared by every test process
// on the machine (a locked file under the temporary directory; the lock
// goes with the process), or returns an error if another holds it.
func lockPort(p int) (unlock func(), err error) {
	dir := filepath.Join(os.TempDir(), "latchkey-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errors.New("held by another process")
		}
		return nil, err
	}
	return func() { _ = f.Close() }, nil // closing drops the lock
}
