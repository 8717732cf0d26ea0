// Package procs supervises real OS child processes for Ferry's fault suite,
// benchmarks and demo: start a binary with its arguments and environment,
// send it signals, kill it, stop it politely, wait for it and start it again.
//
//	bins, err := procs.Build(ctx, dir, "./cmd/relay")
//	p, err := procs.Start(procs.Spec{Name: "relay", Path: bins[0], Args: []string{"run"},
//		Env: []string{"FERRY_DATABASE_URL=" + url}, LogFile: filepath.Join(dir, "relay.log")})
//	p.Signal(syscall.SIGSTOP) // pause it; SIGCONT resumes it
//	p.Kill()                  // SIGKILL, and wait until it is gone
//	p.Restart()               // the same command again, new pid, same log file
//	p.Stop(10 * time.Second)  // SIGTERM, then SIGKILL if it is still there
//
// Every start appends a header line to the log file, so one file holds the
// whole life of a process across restarts. Children get SIGKILL when the
// process that started them dies (Linux's parent-death signal), so a crashed
// harness leaves no strays behind.
package procs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// StopTimeoutDefault is how long Restart waits after SIGTERM before it sends
// SIGKILL, unless Spec.StopTimeout says otherwise.
const StopTimeoutDefault = 10 * time.Second

// ErrNotRunning is returned by Signal on a process that has exited.
var ErrNotRunning = errors.New("process is not running")

// Spec describes a child process.
type Spec struct {
	// Name identifies the process in errors and log headers. Defaults to
	// the base name of Path.
	Name string

	// Path is the binary to run. Required.
	Path string

	// Args are the arguments after the program name.
	Args []string

	// Env is added to the parent's environment; a later entry wins over an
	// earlier one with the same name.
	Env []string

	// Dir is the working directory. Defaults to the parent's.
	Dir string

	// LogFile receives stdout and stderr, appended. Defaults to "": output
	// is discarded.
	LogFile string

	// StopTimeout is how long Restart lets a running process exit after
	// SIGTERM before killing it. Defaults to StopTimeoutDefault (10s).
	StopTimeout time.Duration
}

// Proc is a supervised child process. Its methods are safe for concurrent
// use.
type Proc struct {
	spec Spec

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{} // closed when the current incarnation has been reaped
	err    error         // its exit error, set before done closes
	starts int
}

// Start starts spec's process.
func Start(spec Spec) (*Proc, error) {
	if spec.Path == "" {
		return nil, errors.New("procs: Spec.Path is required")
	}
	if spec.Name == "" {
		spec.Name = baseName(spec.Path)
	}
	if spec.StopTimeout <= 0 {
		spec.StopTimeout = StopTimeoutDefault
	}
	p := &Proc{spec: spec}
	if err := p.start(); err != nil {
		return nil, err
	}
	return p, nil
}

func baseName(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[i+1:]
	}
	return path
}

// start launches a new incarnation; the caller made sure none is running.
func (p *Proc) start() error {
	var out io.Writer = io.Discard
	var f *os.File
	if p.spec.LogFile != "" {
		var err error
		f, err = os.OpenFile(p.spec.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("procs: %s: log file: %w", p.spec.Name, err)
		}
		out = f
	}
	cmd := exec.Command(p.spec.Path, p.spec.Args...)
	cmd.Env = append(os.Environ(), p.spec.Env...)
	cmd.Dir = p.spec.Dir
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group: a Ctrl-C meant for the parent does not reach
	// the child, which the parent stops in its own order. The parent-death
	// signal kills children a crashed parent would otherwise leave behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	p.mu.Lock()
	defer p.mu.Unlock()
	if f != nil {
		fmt.Fprintf(f, "=== procs: start %d of %s at %s: %s %s\n", p.starts+1, p.spec.Name,
			time.Now().UTC().Format(time.RFC3339Nano), p.spec.Path, strings.Join(p.spec.Args, " "))
	}
	if err := cmd.Start(); err != nil {
		if f != nil {
			f.Close()
		}
		return fmt.Errorf("procs: start %s: %w", p.spec.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.err = cmd, done, nil
	p.starts++
	go func() {
		err := cmd.Wait()
		if f != nil {
			fmt.Fprintf(f, "=== procs: %s (pid %d) exited: %s\n", p.spec.Name, cmd.Process.Pid, describeExit(cmd.ProcessState, err))
			f.Close()
		}
		p.mu.Lock()
		if p.cmd == cmd {
			p.err = err
		}
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

func describeExit(st *os.ProcessState, err error) string {
	if st == nil {
		return fmt.Sprint(err)
	}
	return st.String()
}

// current returns the running incarnation's command and done channel.
func (p *Proc) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.done
}

// Name returns the process's name.
func (p *Proc) Name() string { return p.spec.Name }

// LogFile returns the path of the process's log file, "" when discarded.
func (p *Proc) LogFile() string { return p.spec.LogFile }

// Pid returns the pid of the current incarnation, which may have exited.
func (p *Proc) Pid() int {
	cmd, _ := p.current()
	return cmd.Process.Pid
}

// Starts returns how many times the process was started.
func (p *Proc) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Alive reports whether the current incarnation has not exited. A process
// paused with SIGSTOP is alive.
func (p *Proc) Alive() bool {
	_, done := p.current()
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Done returns a channel closed when the current incarnation has exited.
func (p *Proc) Done() <-chan struct{} {
	_, done := p.current()
	return done
}

// Err returns the exit error of the current incarnation once it has exited:
// nil for exit status 0, an *exec.ExitError otherwise. It returns nil while
// the process runs.
func (p *Proc) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Signal sends sig to the current incarnation. It returns ErrNotRunning
// when that has exited.
func (p *Proc) Signal(sig os.Signal) error {
	cmd, done := p.current()
	select {
	case <-done:
		return fmt.Errorf("procs: signal %s to %s: %w", sig, p.spec.Name, ErrNotRunning)
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("procs: signal %s to %s: %w", sig, p.spec.Name, ErrNotRunning)
		}
		return fmt.Errorf("procs: signal %s to %s: %w", sig, p.spec.Name, err)
	}
	return nil
}

// Wait waits until the current incarnation exits or ctx ends, and returns
// its exit error (nil for status 0) or ctx's error.
func (p *Proc) Wait(ctx context.Context) error {
	_, done := p.current()
	select {
	case <-done:
		return p.Err()
	case <-ctx.Done():
		return fmt.Errorf("procs: wait for %s: %w", p.spec.Name, ctx.Err())
	}
}

// Kill sends SIGKILL and waits until the process is gone. Killing a process
// that has already exited does nothing.
func (p *Proc) Kill() {
	cmd, done := p.current()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Stop sends SIGTERM (and SIGCONT, so that a paused process sees it), waits
// up to timeout for the process to exit, then kills it. It returns the exit
// error of a process that exited by itself (nil for status 0), or an error
// saying it had to be killed. Stopping a process that has already exited
// returns its exit error.
func (p *Proc) Stop(timeout time.Duration) error {
	cmd, done := p.current()
	select {
	case <-done:
		return p.Err()
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Process.Signal(syscall.SIGCONT)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return p.Err()
	case <-t.C:
		p.Kill()
		return fmt.Errorf("procs: %s did not exit within %s of SIGTERM: killed", p.spec.Name, timeout)
	}
}

// Restart stops the process if it is running (Stop with Spec.StopTimeout)
// and starts it again with the same spec. The new incarnation has a new pid
// and appends to the same log file.
func (p *Proc) Restart() error {
	if p.Alive() {
		_ = p.Stop(p.spec.StopTimeout)
	}
	return p.start()
}

// Build compiles the main packages pkgs (import paths or ./relative paths,
// resolved from the working directory) into dir and returns the binaries'
// paths, in the order of pkgs. Each binary is named after the last element
// of its package path.
func Build(ctx context.Context, dir string, pkgs ...string) ([]string, error) {
	return BuildTagged(ctx, dir, "", pkgs...)
}

// BuildTagged is Build with build tags (comma-separated; "" for none).
func BuildTagged(ctx context.Context, dir, tags string, pkgs ...string) ([]string, error) {
	if len(pkgs) == 0 {
		return nil, errors.New("procs: Build needs at least one package")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("procs: build dir: %w", err)
	}
	// One go build for all: -o naming a directory takes several mains.
	args := []string{"build", "-o", strings.TrimRight(dir, "/") + "/"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, pkgs...)
	if b, err := exec.CommandContext(ctx, "go", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("procs: go build %s: %w\n%s", strings.Join(pkgs, " "), err, b)
	}
	paths := make([]string, len(pkgs))
	for i, pkg := range pkgs {
		paths[i] = strings.TrimRight(dir, "/") + "/" + baseName(strings.TrimRight(pkg, "/"))
		if _, err := os.Stat(paths[i]); err != nil {
			return nil, fmt.Errorf("procs: go build %s: no binary at %s: %w", pkg, paths[i], err)
		}
	}
	return paths, nil
}
