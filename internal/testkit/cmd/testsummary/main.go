// Command testsummary runs `go test -json ...`, prints what a plain go
// test prints (each package's result, and the output of the tests that
// failed), and appends one line per failure to a file, so that make test
// can list every failure of every part at its end instead of the first
// part's alone:
//
//	testsummary -failures bin/failures.txt -- go test -json -race ./...
//
// A failure is a test that failed (with its package), or a package that
// failed without a failing test of its own: it did not build, it timed
// out, or a test crashed the binary. The exit status is the command's.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Time       time.Time
	Action     string
	Package    string
	ImportPath string // of a build-output or build-fail event
	Test       string
	Output     string
	Elapsed    float64
}

func main() {
	failures := flag.String("failures", "", "append the failures to this file")
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: testsummary [-failures file] -- go test -json [flags] [packages]")
		os.Exit(2)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	s := newSummary(os.Stdout)
	s.read(stdout)
	waitErr := cmd.Wait()
	failed := s.failed()
	if *failures != "" && len(failed) > 0 {
		if err := appendLines(*failures, failed); err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
		}
	}
	if waitErr != nil {
		if exit, ok := waitErr.(*exec.ExitError); ok {
			os.Exit(exit.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "testsummary:", waitErr)
		os.Exit(2)
	}
	if len(failed) > 0 {
		os.Exit(1) // a failure the command's status did not show
	}
}

// summary keeps each running test's output until the test ends: printed
// if it failed, dropped if it passed, as go test without -v does.
type summary struct {
	out            io.Writer
	pending        map[string][]string // package + "\x00" + test -> output lines
	tests          []string            // "package Test/sub" that failed
	pkgs           map[string]bool     // packages that failed
	withFailedTest map[string]bool
}

func newSummary(out io.Writer) *summary {
	return &summary{out: out, pending: map[string][]string{}, pkgs: map[string]bool{}, withFailedTest: map[string]bool{}}
}

// read handles the events of r; a line that is not an event (the go
// command's own messages) is printed as it is.
func (s *summary) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(s.out, "%s\n", line)
			continue
		}
		s.handle(e)
	}
}

func (s *summary) handle(e event) {
	pkg := e.Package
	if pkg == "" {
		pkg = e.ImportPath
	}
	id := pkg + "\x00" + e.Test
	switch {
	case e.Action == "build-output":
		fmt.Fprint(s.out, e.Output)
	case e.Action == "build-fail":
		s.pkgs[pkg] = true
	case e.Test == "" && e.Action == "output":
		if e.Output != "PASS\n" { // go test prints it only with -v
			fmt.Fprint(s.out, e.Output)
		}
	case e.Test == "" && e.Action == "fail":
		s.pkgs[pkg] = true
		s.flush(pkg) // the tests still running when the binary died
	case e.Action == "output":
		s.pending[id] = append(s.pending[id], e.Output)
	case e.Action == "fail":
		for _, l := range s.pending[id] {
			fmt.Fprint(s.out, l)
		}
		delete(s.pending, id)
		s.tests = append(s.tests, pkg+" "+e.Test)
		s.withFailedTest[pkg] = true
	case e.Action == "pass" || e.Action == "skip":
		delete(s.pending, id)
	}
}

// flush prints the output of pkg's tests that never ended.
func (s *summary) flush(pkg string) {
	var ids []string
	for id := range s.pending {
		if strings.HasPrefix(id, pkg+"\x00") {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		for _, l := range s.pending[id] {
			fmt.Fprint(s.out, l)
		}
		delete(s.pending, id)
	}
}

// failed lists the failures: every failed test (a parent whose subtests
// failed too is left out: its subtests say more), then every failed
// package without a failed test of its own.
func (s *summary) failed() []string {
	var out []string
	for _, t := range s.tests {
		parent := false
		for _, u := range s.tests {
			parent = parent || strings.HasPrefix(u, t+"/")
		}
		if !parent {
			out = append(out, "FAIL "+t)
		}
	}
	var pkgs []string
	for pkg := range s.pkgs {
		if !s.withFailedTest[pkg] {
			pkgs = append(pkgs, pkg)
		}
	}
	slices.Sort(pkgs)
	for _, pkg := range pkgs {
		out = append(out, "FAIL "+pkg+" (no test failed: the package did not build, timed out or crashed; its output is above)")
	}
	return out
}

func appendLines(path string, lines []string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strings.Join(lines, "\n") + "\n")
	return errors.Join(err, f.Close())
}
