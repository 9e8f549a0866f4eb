// Command mutants plants each bug of internal/testkit/mutants in a copy of the
// tree and runs the tiers of tests against it, to say which tier catches
// which bug, and how fast:
//
//	go run ./internal/testkit/cmd/mutants [-only name,...] [-tiers model,regressions,packages,e2e,soak] [-runs N] [-first] [-write docs/guarantees.md]
//
// The tiers, cheapest first:
//
//   - model: the randomized test (internal/testkit/model TestModel) at its make
//     test budget, on its default seeds, without shrinking; -runs repeats
//     it, to show that what it catches it catches every time;
//   - regressions: the seeds the randomized test found bugs with;
//   - packages: every package's own tests but the model's, e2e's and the
//     soak's (unit, conformance, in-process Caddy);
//   - e2e: the end-to-end tests, against a caddy built from the mutated
//     tree (xcaddy, as make build);
//   - soak: a two-minute chaos soak (not by default).
//
// Redis and PostgreSQL come from IDEMPOTENCY_REDIS_URL and
// IDEMPOTENCY_POSTGRES_DSN (make mutants starts private ones). The
// unmutated tree runs the model tier first: a tier that fails there
// proves nothing about a mutant. The result is a table; -write puts it
// into a markdown file between <!-- mutants --> and <!-- /mutants -->.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/mutants"
)

// tier is one level of tests: a command run in the mutated tree.
type tier struct {
	name string
	run  func(dir string) error
}

func main() {
	only := flag.String("only", "", "mutants to plant, by name, separated by commas (default: all)")
	tiersFlag := flag.String("tiers", "model,regressions,packages,e2e", "tiers to run, separated by commas (also: soak)")
	runs := flag.Int("runs", 1, "times to run the model tier on each mutant")
	write := flag.String("write", "", "put the table into this markdown file, between <!-- mutants --> and <!-- /mutants -->")
	first := flag.Bool("first", false, "stop at the first tier that catches a mutant (the later tiers show \"-\"): what make test as a whole catches, at a fraction of the time")
	flag.Parse()

	root, err := repoRoot()
	if err != nil {
		fail(err)
	}
	tiers := selectTiers(*tiersFlag, *runs)
	var chosen []mutants.Mutant
	for _, m := range mutants.All {
		if *only == "" || slices.Contains(strings.Split(*only, ","), m.Name) {
			chosen = append(chosen, m)
		}
	}

	// The unmutated tree first: every tier but e2e and soak must pass it.
	clean, err := copyTree(root)
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(clean)
	for _, t := range tiers {
		if t.name != "model" {
			continue
		}
		logf("the unmutated tree, tier %s", t.name)
		if err := t.run(clean); err != nil {
			fail(fmt.Errorf("the unmutated tree fails tier %s, so it proves nothing about mutants: %w", t.name, err))
		}
	}

	results := make([][]result, len(chosen))
	for i, m := range chosen {
		dir, err := copyTree(root)
		if err != nil {
			fail(err)
		}
		if err := m.Plant(dir); err != nil {
			fail(err)
		}
		for _, t := range tiers {
			if *first && slices.ContainsFunc(results[i], func(r result) bool { return r.caught }) {
				results[i] = append(results[i], result{tier: t.name, after: true})
				continue
			}
			logf("mutant %s, tier %s", m.Name, t.name)
			start := time.Now()
			err := t.run(dir)
			r := result{tier: t.name, caught: err != nil, took: time.Since(start)}
			var notRun errNotRun
			if errors.As(err, &notRun) {
				r.caught, r.skipped = false, true
			}
			results[i] = append(results[i], r)
			logf("mutant %s, tier %s: caught %v in %s", m.Name, t.name, r.caught, r.took.Round(time.Second))
		}
		os.RemoveAll(dir)
	}
	table := render(chosen, tiers, results)
	fmt.Print(table)
	if *write != "" {
		if err := writeBetween(*write, table); err != nil {
			fail(err)
		}
	}
}

type result struct {
	tier    string
	caught  bool
	skipped bool
	after   bool // not run: an earlier tier caught the mutant (-first)
	took    time.Duration
}

// errNotRun: a tier that could not run for this mutant.
type errNotRun struct{ why string }

func (e errNotRun) Error() string { return e.why }

func selectTiers(names string, runs int) []tier {
	all := map[string]tier{
		"model": {"model", func(dir string) error {
			for range runs {
				if err := goTest(dir, "-run", "^TestModel$", "./internal/testkit/model/", "-model.shrink-kinds", "0"); err != nil {
					return err
				}
			}
			return nil
		}},
		"regressions": {"regressions", func(dir string) error {
			return goTest(dir, "-run", "^(TestModelRegressions|TestModelTrialsAreIsolated)$", "./internal/testkit/model/")
		}},
		"packages": {"packages", func(dir string) error {
			pkgs, err := packages(dir)
			if err != nil {
				return err
			}
			return goTest(dir, append([]string{"-short"}, pkgs...)...)
		}},
		"e2e": {"e2e", func(dir string) error {
			bin := filepath.Join(dir, "bin", "caddy")
			if err := command(dir, nil, "make", "build"); err != nil {
				return errNotRun{"the mutated tree does not build with xcaddy: " + err.Error()}
			}
			return goTest(dir, "-timeout", "30m", "./e2e/", "-env", "IDEMPOTENCY_CADDY_BIN="+bin)
		}},
		"soak": {"soak", func(dir string) error {
			if err := command(dir, nil, "make", "build"); err != nil {
				return errNotRun{"the mutated tree does not build with xcaddy: " + err.Error()}
			}
			return command(dir, []string{"IDEMPOTENCY_CADDY_BIN=" + filepath.Join(dir, "bin", "caddy")}, "go", "run", "./soak", "-duration", "2m")
		}},
	}
	var out []tier
	for _, n := range strings.Split(names, ",") {
		t, ok := all[n]
		if !ok {
			fail(fmt.Errorf("no tier %q", n))
		}
		out = append(out, t)
	}
	return out
}

// goTest runs go test in dir; "-env", "K=V" pairs among args set the
// environment instead.
func goTest(dir string, args ...string) error {
	var env, rest []string
	for i := 0; i < len(args); i++ {
		if args[i] == "-env" && i+1 < len(args) {
			env = append(env, args[i+1])
			i++
			continue
		}
		rest = append(rest, args[i])
	}
	return command(dir, env, "go", append([]string{"test", "-count=1"}, rest...)...)
}

// packages are the packages of the packages tier: all but the model's,
// e2e's, the soak's and this command's own.
func packages(dir string) ([]string, error) {
	cmd := exec.Command("go", "list", "./...")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		if strings.HasSuffix(p, "/internal/testkit/model") || strings.HasSuffix(p, "/e2e") || strings.HasSuffix(p, "/soak") ||
			strings.HasSuffix(p, "/internal/testkit/mutants") || strings.HasSuffix(p, "/internal/testkit/cmd/mutants") {
			continue
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

// command runs name with args in dir, its output kept for the error.
func command(dir string, env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		tail := out.String()
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, tail)
	}
	return nil
}

// copyTree copies the files of the repository (tracked and untracked,
// not ignored) into a new temporary directory.
func copyTree(root string) (string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("listing the tree: %w", err)
	}
	dir, err := os.MkdirTemp("", "mutant-*")
	if err != nil {
		return "", err
	}
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted, not yet committed
			}
			return "", err
		}
		dst := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", err
		}
		info, err := os.Stat(filepath.Join(root, f))
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(dst, src, info.Mode().Perm()); err != nil {
			return "", err
		}
	}
	// A git repository of its own, so that the build stamps a version
	// (make build) as it does in a checkout.
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A"}, {"-c", "user.name=mutants", "-c", "user.email=mutants@localhost", "commit", "-qm", "mutant"}} {
		c := exec.Command("git", args...)
		c.Dir = dir
		if out, err := c.CombinedOutput(); err != nil {
			return "", fmt.Errorf("git %s: %w: %s", args[0], err, out)
		}
	}
	return dir, nil
}

func repoRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", errors.New("run mutants inside the repository")
	}
	return strings.TrimSpace(string(out)), nil
}

// render is the table: a row per mutant, a column per tier, and the
// audit's count for the model tier.
func render(ms []mutants.Mutant, tiers []tier, results [][]result) string {
	var b strings.Builder
	b.WriteString("| Planted bug | What it breaks |")
	for _, t := range tiers {
		fmt.Fprintf(&b, " %s |", t.name)
	}
	b.WriteString("\n| --- | --- |")
	for range tiers {
		b.WriteString(" --- |")
	}
	b.WriteString("\n")
	auditCaught, audit := 0, 0
	for i, m := range ms {
		name := "`" + m.Name + "`"
		if m.Audit {
			name += " (audit)"
			audit++
		}
		fmt.Fprintf(&b, "| %s | %s |", name, m.Breaks)
		for _, r := range results[i] {
			switch {
			case r.after:
				b.WriteString(" - |")
			case r.skipped:
				b.WriteString(" not run |")
			case r.caught:
				fmt.Fprintf(&b, " caught (%s) |", r.took.Round(time.Second))
			default:
				fmt.Fprintf(&b, " missed (%s) |", r.took.Round(time.Second))
			}
			if r.tier == "model" && r.caught && m.Audit {
				auditCaught++
			}
		}
		b.WriteString("\n")
	}
	if slices.ContainsFunc(tiers, func(t tier) bool { return t.name == "model" }) {
		fmt.Fprintf(&b, "\nThe randomized test alone, at its make test budget, caught %d of the %d audit bugs.\n", auditCaught, audit)
	}
	return b.String()
}

// writeBetween replaces what path holds between the mutants markers with
// table.
func writeBetween(path, table string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	const open, close = "<!-- mutants -->\n", "<!-- /mutants -->"
	s := string(src)
	i, j := strings.Index(s, open), strings.Index(s, close)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q ... %q", path, strings.TrimSpace(open), close)
	}
	return os.WriteFile(path, []byte(s[:i+len(open)]+table+s[j:]), 0o644)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "mutants: "+format+"\n", args...)
}

func fail(err error) {
	logf("%v", err)
	os.Exit(1)
}
