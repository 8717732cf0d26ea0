package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

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
	case <-p.done:
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// cpuSeconds is the user plus system CPU time the process has used.
func (p *process) cpuSeconds() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid()))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// count fields after its closing parenthesis (state is field 3).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("unreadable /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	utime, err1 := strconv.ParseFloat(f[11], 64) // field 14
	stime, err2 := strconv.ParseFloat(f[12], 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (utime + stime) / clockTicks, nil
}

// memMB reads VmRSS (resident now) or VmHWM (peak resident) in MiB.
func (p *process) memMB(field string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.pid()))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}
