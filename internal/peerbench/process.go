package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ferryhq/ferry/internal/procs"
)

// process is one peer's relay, a real process started by the driver: the
// CPU and memory figures are read from /proc for its pid alone (the JVM for
// Debezium, no wrapper script).
type process struct {
	cmd     *exec.Cmd
	started time.Time
	done    chan error
	logFile string
}

func startProcess(logFile string, env []string, name string, args ...string) (*process, error) {
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	started := time.Now()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{cmd: cmd, started: started, done: make(chan error, 1), logFile: logFile}
	go func() { p.done <- cmd.Wait(); f.Close() }()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exited returns an error saying how the process ended, or nil while it runs.
func (p *process) exited() error {
	select {
	case err := <-p.done:
		p.done <- err
		return fmt.Errorf("%s exited: %v (log %s)", filepath.Base(p.cmd.Path), err, p.logFile)
	default:
		return nil
	}
}

// stop sends SIGTERM and waits up to a minute, then kills.
func (p *process) stop() {
	if p.exited() != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err // stopped: a second stop returns at once
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		p.done <- <-p.done
	}
}

// cpuSeconds is the user plus system CPU time the process has used.
func (p *process) cpuSeconds() (float64, error) { return procs.CPUSeconds(p.pid()) }

// memMB reads VmRSS (resident now) or VmHWM (peak resident) in MiB.
func (p *process) memMB(field string) float64 { return procs.MemMB(p.pid(), field) }
