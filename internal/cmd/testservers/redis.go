//go:build unix

package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"
)

// startRedis starts redis-server without persistence on a free loopback
// port and waits until it answers PING.
func (s *servers) startRedis(bin string) error {
	dir := filepath.Join(s.dir, "redis")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	logFile := filepath.Join(dir, "redis.log")
	var lastErr error
	for range startAttempts {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		cmd := exec.Command(bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no",
			"--daemonize", "no", "--dir", dir, "--logfile", logFile)
		cmd.Dir = dir
		p, err := s.launch("redis-server", cmd, nil, syscall.SIGTERM)
		if err != nil {
			return err
		}
		if lastErr = waitRedis(p, addr); lastErr == nil {
			url := "redis://" + addr + "/0"
			s.env = append(s.env, envRedisURL+"="+url, envRedisAddr+"="+addr)
			s.names = append(s.names, "redis-server")
			logf("redis-server %s on %s: %s=%s", redisVersion(bin), addr, envRedisURL, url)
			return nil
		}
		if err := p.stop(); err != nil {
			return err
		}
	}
	return fmt.Errorf("redis-server did not start: %v\n%s", lastErr, tail(logFile, 20))
}

// waitRedis waits until the server at addr answers PING, or exits.
func waitRedis(p *server, addr string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := ping(addr)
		if err == nil {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("redis-server on %s exited", addr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s: no answer within 10s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ping sends PING in RESP and expects +PONG.
func ping(addr string) error {
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

// redisVersion is the version redis-server reports, for the log.
func redisVersion(bin string) string {
	out, _ := exec.Command(bin, "--version").Output()
	if m := redisVersionRE.FindSubmatch(out); m != nil {
		return string(m[1])
	}
	return "(version unknown)"
}
