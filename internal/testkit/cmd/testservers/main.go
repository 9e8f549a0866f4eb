//go:build unix

// Command testservers runs a command against Redis and PostgreSQL servers
// of its own, and cleans up after it:
//
//	testservers [--] command [arg...]
//
// For each server the environment does not already name
// (IDEMPOTENCY_REDIS_URL, or its older spelling IDEMPOTENCY_REDIS_ADDR
// with a host:port; IDEMPOTENCY_POSTGRES_DSN), it starts a private,
// throwaway instance on a free loopback port, with its files in a
// temporary directory, and sets the variable for the command:
//
//   - redis-server without persistence, bound to 127.0.0.1;
//   - a PostgreSQL cluster made by initdb for this run alone (trust
//     authentication inside that cluster only, superuser postgres,
//     database test), listening on 127.0.0.1 and on a Unix socket in the
//     temporary directory.
//
// When the command ends, or testservers is interrupted (the first
// SIGINT, SIGTERM or SIGHUP is passed on to the command, a second one
// kills it), the servers are stopped, testservers checks that no process
// still runs in the directory and removes it, and it exits with the
// command's status (128+n for a command killed by signal n).
//
// It never touches the system's own servers, their configuration or their
// services. initdb and postgres refuse to run as root: under root they run
// as the postgres system user (nobody when there is none). A missing
// binary is installed with apt-get under root (CI, a container) and named,
// with the command that installs it, otherwise.
//
// It does not import Caddy: it builds in a second and runs anywhere Go does.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "testservers: "+format+"\n", args...)
}

func run(args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: testservers [--] command [arg...]")
		return 2
	}
	// From here on no signal may end this process before the servers are
	// stopped and their files removed.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	var s servers
	code := 1
	err := s.start()
	if err == nil {
		// Starting takes a few seconds; an interrupt meanwhile waited.
		select {
		case sig := <-sigs:
			err = fmt.Errorf("%v while starting the servers", sig)
			code = 128 + int(sig.(syscall.Signal))
		default:
		}
	}
	if err != nil {
		logf("%v", err)
	} else {
		code = command(args, s.env, sigs)
	}
	if err := s.stop(); err != nil {
		logf("%v", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// command runs args with env added to the environment, passes signals on
// to it, and returns its exit status.
func command(args, env []string, sigs <-chan os.Signal) int {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), env...) // the last of duplicate keys wins
	if err := cmd.Start(); err != nil {
		logf("%v", err)
		return 127
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for signals := 0; ; {
		select {
		case err := <-done:
			return exitStatus(cmd.ProcessState, err)
		case sig := <-sigs:
			// The command shares the terminal's process group, so a ^C
			// reaches it directly too; passing it on covers a signal sent
			// to this process alone (kill, a CI runner's timeout).
			if signals++; signals == 1 {
				logf("%v: passing it on to %s; stopping the servers when it exits", sig, args[0])
				_ = cmd.Process.Signal(sig)
			} else {
				logf("%v again: killing %s", sig, args[0])
				_ = cmd.Process.Kill()
			}
		}
	}
}

// exitStatus is the shell's view of how a command ended.
func exitStatus(ps *os.ProcessState, err error) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if code := ps.ExitCode(); code >= 0 {
		return code
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		logf("%v", err)
	}
	return 1
}
