package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// server is one private redis-server (a data node or a Sentinel) that
// can be killed with SIGKILL and started again on the same port, with
// the same files.
type server struct {
	name string
	addr string
	bin  string
	dir  string
	args []string // besides port, bind and dir
	cmd  *exec.Cmd
	done chan struct{}
}

// startServer starts redis-server bin in a directory of its own under
// root with args.
func startServer(bin, root, name string, args ...string) (*server, error) {
	port, err := caddyproc.FreePort()
	if err != nil {
		return nil, err
	}
	s := &server{name: name, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), bin: bin,
		dir: filepath.Join(root, name), args: args}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, err
	}
	return s, s.start()
}

func (s *server) start() error {
	_, port, _ := net.SplitHostPort(s.addr)
	args := append([]string{}, s.args...)
	if len(args) > 0 && strings.HasSuffix(args[0], ".conf") {
		// A configuration file comes first (a Sentinel's).
		args = append(args[:1:1], append([]string{"--port", port}, args[1:]...)...)
	} else {
		args = append([]string{"--port", port}, args...)
	}
	args = append(args, "--bind", "127.0.0.1", "--dir", s.dir, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--logfile", filepath.Join(s.dir, "redis.log"))
	s.cmd = exec.Command(s.bin, args...)
	s.cmd.Dir = s.dir
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	s.done = done
	go func() { s.cmd.Wait(); close(done) }()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		c := goredis.NewClient(&goredis.Options{Addr: s.addr, MaxRetries: -1})
		err := c.Ping(context.Background()).Err()
		c.Close()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited at start", s.name)
		default:
		}
	}
	return fmt.Errorf("%s did not answer within 15s", s.name)
}

// kill ends the server with SIGKILL and waits for it.
func (s *server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		<-s.done
	}
}

// lagThenKill cuts primary's link to its replica (CLIENT KILL TYPE
// replica, the replica stopped meanwhile so that it cannot reconnect at
// once, as after a network blip between them), lets primary take writes
// alone for lag, then kills it (SIGKILL) and lets the replica go on: the
// writes of those lag exist on primary only. With lag 0 it only kills
// primary.
func lagThenKill(primary, replica *server, lag time.Duration) {
	if lag <= 0 || replica == nil {
		primary.kill()
		return
	}
	replica.cmd.Process.Signal(syscall.SIGSTOP)
	c := primary.client()
	c.Do(context.Background(), "CLIENT", "KILL", "TYPE", "replica")
	c.Close()
	time.Sleep(lag)
	primary.kill()
	replica.cmd.Process.Signal(syscall.SIGCONT)
}

// restart starts the killed server again on its port; the port may
// linger for a moment.
func (s *server) restart() error {
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err = s.start(); err == nil {
			return nil
		}
		s.kill()
	}
	return err
}

// stop ends the server (SIGTERM), waiting at most 5s, then SIGKILL.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.kill()
	}
}

// client is a plain client of the server.
func (s *server) client() *goredis.Client {
	return goredis.NewClient(&goredis.Options{Addr: s.addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
}

// info returns field of the server's INFO section; "" when it does not
// answer.
func (s *server) info(section, field string) string {
	c := s.client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := c.Info(ctx, section).Result()
	if err != nil {
		return ""
	}
	for line := range strings.Lines(v) {
		if val, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return val
		}
	}
	return ""
}

// inSyncReplica reports whether the server is a replica done syncing
// with its primary.
func (s *server) inSyncReplica() bool {
	return s.info("replication", "role") == "slave" && s.info("replication", "master_link_status") == "up" &&
		s.info("replication", "master_sync_in_progress") == "0"
}

// waitFor polls cond every 100ms for up to within.
func waitFor(within time.Duration, what string, cond func() bool) error {
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		if cond() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v", what, within)
		}
	}
}
