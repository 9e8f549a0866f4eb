//go:build unix

package servers

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// RedisOptions configure a private Redis.
type RedisOptions struct {
	// Persistent turns the append-only file on, fsynced before every
	// write is acknowledged (appendfsync always), so that a restart, even
	// after kill -9, loses no acknowledged write. Without it the server
	// keeps nothing on disk and a restart starts empty.
	Persistent bool
}

// Redis is a private redis-server bound to loopback.
type Redis struct {
	// Addr is the server's host:port; it stays the same across restarts.
	Addr string

	bin, dir, log string
	opts          RedisOptions
	mu            sync.Mutex
	proc          *process
}

// StartRedis starts redis-server (the program bin) on a free loopback
// port, with its files in the set's directory, and waits until it answers
// PING.
func (s *Set) StartRedis(bin string, opts RedisOptions) (*Redis, error) {
	dir, err := s.subdir("redis", nil)
	if err != nil {
		return nil, err
	}
	r := &Redis{bin: bin, dir: dir, log: filepath.Join(dir, "redis.log"), opts: opts}
	var lastErr error
	for range startAttempts {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		r.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = r.start(10 * time.Second); lastErr == nil {
			s.add(r)
			return r, nil
		}
	}
	return nil, fmt.Errorf("redis-server did not start: %v\n%s", lastErr, tail(r.log, 20))
}

// URL is the redis:// URL of database 0.
func (r *Redis) URL() string { return "redis://" + r.Addr + "/0" }

// start runs the server on r.Addr and waits until it answers; the caller
// holds no lock.
func (r *Redis) start(within time.Duration) error {
	_, port, _ := net.SplitHostPort(r.Addr)
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "",
		"--daemonize", "no", "--dir", r.dir, "--logfile", r.log}
	if r.opts.Persistent {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	cmd := exec.Command(r.bin, args...)
	cmd.Dir = r.dir
	p, err := launch("redis-server", cmd, nil, syscall.SIGTERM)
	if err != nil {
		return err
	}
	if err := waitRedis(p, r.Addr, within); err != nil {
		p.kill()
		return err
	}
	r.mu.Lock()
	r.proc = p
	r.mu.Unlock()
	return nil
}

func (r *Redis) current() *process {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc
}

// Stop shuts the server down cleanly (SIGTERM: a persistent server
// writes its file first) and waits for it.
func (r *Redis) Stop() error {
	if p := r.current(); p != nil {
		return p.stop()
	}
	return nil
}

// Kill ends the server at once (SIGKILL) and waits for it.
func (r *Redis) Kill() {
	if p := r.current(); p != nil {
		p.kill()
	}
}

// Restart starts the server again on the same port after Stop or Kill,
// with the same files, and waits until it answers. The port can linger
// for a moment after a kill: it keeps trying for up to a minute.
func (r *Redis) Restart() error {
	if p := r.current(); p != nil && !p.exited() {
		return errors.New("redis-server is still running")
	}
	var err error
	for deadline := time.Now().Add(restartWithin); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err = r.start(10 * time.Second); err == nil {
			return nil
		}
	}
	return fmt.Errorf("redis-server did not restart on %s: %v\n%s", r.Addr, err, tail(r.log, 20))
}

// waitRedis waits until the server at addr answers PING, or exits.
func waitRedis(p *process, addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		err := PingRedis(addr)
		if err == nil {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("redis-server on %s exited", addr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s: no answer within %v: %v", addr, within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PingRedis sends PING in RESP to the server at addr and expects +PONG.
// A server still loading its file answers -LOADING, an error here.
func PingRedis(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

var redisVersionRE = regexp.MustCompile(`v=(\S+)`)

// RedisVersion is the version the program bin reports, for logs.
func RedisVersion(bin string) string {
	out, _ := exec.Command(bin, "--version").Output()
	if m := redisVersionRE.FindSubmatch(out); m != nil {
		return string(m[1])
	}
	return "(version unknown)"
}
