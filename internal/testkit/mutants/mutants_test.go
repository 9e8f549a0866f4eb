package mutants

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryMutantPlantsAndBuilds plants each mutant in a copy of its file
// and checks that it applies (its code is still there, once) and that
// the tree still compiles with it: a mutant that no longer plants, or
// that breaks the build, proves nothing.
func TestEveryMutantPlantsAndBuilds(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	audit := 0
	for _, m := range All {
		if names[m.Name] {
			t.Errorf("two mutants named %s", m.Name)
		}
		names[m.Name] = true
		if m.Audit {
			audit++
		}
		if m.Breaks == "" || m.Old == m.New {
			t.Errorf("mutant %s: says nothing or changes nothing", m.Name)
		}
		src, err := os.ReadFile(filepath.Join(root, m.File))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(src), m.Old); n != 1 {
			t.Errorf("mutant %s: %s holds its code %d times, want once", m.Name, m.File, n)
		}
	}
	if audit != 12 {
		t.Errorf("%d audit mutants, want the 12 of the audit", audit)
	}
	if testing.Short() {
		return
	}
	// Each one compiles: go vet of its package with the file swapped in
	// through an overlay, without copying the tree.
	for _, m := range All {
		t.Run(m.Name, func(t *testing.T) {
			dir := t.TempDir()
			src, _ := os.ReadFile(filepath.Join(root, m.File))
			mutated := filepath.Join(dir, filepath.Base(m.File))
			if err := os.WriteFile(mutated, []byte(strings.Replace(string(src), m.Old, m.New, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			overlay := filepath.Join(dir, "overlay.json")
			js := `{"Replace":{"` + filepath.Join(root, m.File) + `":"` + mutated + `"}}`
			if err := os.WriteFile(overlay, []byte(js), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("go", "build", "-overlay", overlay, "./"+filepath.Dir(m.File))
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("the tree does not build with mutant %s: %v\n%s", m.Name, err, out)
			}
		})
	}
}
