package caddyproc

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Instance is one `caddy run` process on loopback with its own admin
// endpoint, data directories and log.
type Instance struct {
	Name      string
	AdminAddr string // host:port of the admin API
	Port      int    // the port Sites listen on (as the caller wrote them)

	bin, dir string
	cmd      *exec.Cmd
	logBuf   *lockedBuffer
	exited   chan struct{}
	exitErr  error
}

// Config is what an Instance runs: global options (besides admin,
// auto_https and persist_config, which Start sets) and site blocks.
type Config struct {
	Globals string
	Sites   string
}

func (c Config) caddyfile(admin string) string {
	return fmt.Sprintf("{\n\tadmin %s\n\tauto_https off\n\tpersist_config off\n%s\n}\n\n%s\n", admin, c.Globals, c.Sites)
}

// Start runs bin with cfg in dir and waits until its admin API answers.
func Start(bin, dir, name string, port int, cfg Config) (*Instance, error) {
	adminPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	admin := fmt.Sprintf("127.0.0.1:%d", adminPort)
	return Run(bin, dir, name, admin, port, cfg.caddyfile(admin))
}

// Run runs bin with a whole Caddyfile whose admin endpoint is admin (and
// which serves on port) in dir, and waits until its admin API answers. A
// Caddyfile that Caddy refuses ends the process: the error says "exited"
// and holds the log, which says why.
func Run(bin, dir, name, admin string, port int, caddyfile string) (*Instance, error) {
	inst := &Instance{
		Name:      name,
		AdminAddr: admin,
		Port:      port,
		bin:       bin,
		dir:       filepath.Join(dir, name),
		logBuf:    new(lockedBuffer),
		exited:    make(chan struct{}),
	}
	if err := os.MkdirAll(inst.dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(inst.dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o644); err != nil {
		return nil, err
	}
	inst.cmd = exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	inst.cmd.Env = append(os.Environ(),
		"XDG_DATA_HOME="+filepath.Join(inst.dir, "data"),
		"XDG_CONFIG_HOME="+filepath.Join(inst.dir, "config"),
	)
	inst.cmd.Stdout, inst.cmd.Stderr = inst.logBuf, inst.logBuf
	inst.cmd.SysProcAttr = procAttr()
	if err := inst.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		inst.exitErr = inst.cmd.Wait()
		close(inst.exited)
	}()
	if err := inst.waitReady(20 * time.Second); err != nil {
		inst.Kill()
		return nil, fmt.Errorf("caddy %s did not start: %v\n%s", name, err, inst.Log())
	}
	return inst, nil
}

// URL returns the base URL of the instance's site on its port.
func (i *Instance) URL() string { return fmt.Sprintf("http://127.0.0.1:%d", i.Port) }

func (i *Instance) waitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case <-i.exited:
			return fmt.Errorf("exited: %v", i.exitErr)
		default:
		}
		resp, err := http.Get("http://" + i.AdminAddr + "/config/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("timed out waiting for the admin API")
}

// Reload loads cfg through the admin API, as `caddy reload` does.
func (i *Instance) Reload(cfg Config) error {
	body := cfg.caddyfile(i.AdminAddr)
	req, _ := http.NewRequest(http.MethodPost, "http://"+i.AdminAddr+"/load", strings.NewReader(body))
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return fmt.Errorf("reload: %s: %s", resp.Status, b.String())
	}
	return nil
}

// Kill ends the process at once (SIGKILL), as a crash would.
func (i *Instance) Kill() {
	_ = i.cmd.Process.Signal(syscall.SIGCONT) // a paused process must die too
	_ = i.cmd.Process.Kill()
	<-i.exited
}

// Pause freezes the process (SIGSTOP): it keeps its connections but runs
// nothing, like a machine stalled by a long GC pause or a network partition.
func (i *Instance) Pause() error { return i.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume undoes Pause.
func (i *Instance) Resume() error { return i.cmd.Process.Signal(syscall.SIGCONT) }

// Stop asks the process to exit gracefully and kills it after a grace
// period.
func (i *Instance) Stop() {
	select {
	case <-i.exited:
		return
	default:
	}
	_ = i.cmd.Process.Signal(syscall.SIGCONT)
	_ = i.cmd.Process.Signal(os.Interrupt)
	select {
	case <-i.exited:
	case <-time.After(10 * time.Second):
		i.Kill()
	}
}

// Terminate sends SIGTERM, as a service manager stops Caddy, and reports
// whether the process exited within the bound; one that did not is killed.
func (i *Instance) Terminate(within time.Duration) bool {
	_ = i.cmd.Process.Signal(syscall.SIGCONT)
	_ = i.cmd.Process.Signal(syscall.SIGTERM)
	return i.WaitExit(within)
}

// WaitExit reports whether the process exited within the bound (after a
// POST /stop, a SIGTERM); one that did not is killed.
func (i *Instance) WaitExit(within time.Duration) bool {
	select {
	case <-i.exited:
		return true
	case <-time.After(within):
		i.Kill()
		return false
	}
}

// PID is the process id: a test checks with it that Caddy was not
// restarted.
func (i *Instance) PID() int { return i.cmd.Process.Pid }

// Running reports whether the process has not exited.
func (i *Instance) Running() bool {
	select {
	case <-i.exited:
		return false
	default:
		return true
	}
}

// Log returns what the process has written so far.
func (i *Instance) Log() string { return i.logBuf.String() }

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
