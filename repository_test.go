package idempotency

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// No compiled executable is tracked: a binary in the repository is build
// output (a stray `go build` of the planted-bugs runner once put a 3 MB
// one at the root), unreviewable, and stale the moment the source moves.
// ELF, Mach-O (both byte orders, and fat) and PE files are refused.
func TestNoCompiledExecutableIsTracked(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	magics := [][]byte{
		[]byte("\x7fELF"),
		{0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf}, {0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe},
		{0xca, 0xfe, 0xba, 0xbe},
		[]byte("MZ"),
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		f, err := os.Open(name)
		if err != nil {
			continue // deleted in the work tree
		}
		head := make([]byte, 4)
		n, _ := f.Read(head)
		f.Close()
		for _, m := range magics {
			if bytes.HasPrefix(head[:n], m) {
				t.Errorf("%s is a compiled executable: remove it from git (git rm --cached) and ignore it", name)
			}
		}
	}
}
