//go:build !unix

package testenv

// lockPort reserves nothing across processes where there are no file
// locks: FreePort's reservation then holds within the process only.
func lockPort(int) (unlock func(), err error) { return func() {}, nil }
