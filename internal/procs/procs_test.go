package procs_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/procs"
)

func sh(t *testing.T, script string) procs.Spec {
	t.Helper()
	return procs.Spec{Name: "sh", Path: "/bin/sh", Args: []string{"-c", script}, LogFile: filepath.Join(t.TempDir(), "sh.log")}
}

func start(t *testing.T, spec procs.Spec) *procs.Proc {
	t.Helper()
	p, err := procs.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

func readLog(t *testing.T, p *procs.Proc) string {
	t.Helper()
	b, err := os.ReadFile(p.LogFile())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// output is the log without the "=== procs:" lines, which quote the script.
func output(t *testing.T, p *procs.Proc) string {
	t.Helper()
	var out []string
	for _, l := range strings.SplitAfter(readLog(t, p), "\n") {
		if !strings.HasPrefix(l, "=== procs:") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// procState is the state letter of /proc/PID/stat: R, S, T (stopped), ...
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0]
}

func TestOutputEnvAndExitStatusReachTheCaller(t *testing.T) {
	t.Parallel()
	spec := sh(t, `echo "out $PROCS_TEST"; echo err >&2; exit 4`)
	spec.Env = []string{"PROCS_TEST=first", "PROCS_TEST=second"}
	p := start(t, spec)
	err := p.Wait(context.Background())
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 4 {
		t.Fatalf("Wait = %v, want exit status 4", err)
	}
	if p.Alive() {
		t.Fatal("Alive after exit")
	}
	log := readLog(t, p)
	for _, want := range []string{"out second\n", "err\n", "=== procs: start 1 of sh", "exited: exit status 4"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, procs.ErrNotRunning) {
		t.Fatalf("Signal after exit = %v, want ErrNotRunning", err)
	}
}

func TestKillEndsAProcessThatIgnoresSIGTERM(t *testing.T) {
	t.Parallel()
	p := start(t, sh(t, `trap '' TERM; echo ready; while :; do sleep 0.05; done`))
	waitFor(t, "ready", func() bool { return strings.Contains(output(t, p), "ready") })
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if !p.Alive() {
		t.Fatal("the process exited on an ignored SIGTERM")
	}
	p.Kill()
	if p.Alive() {
		t.Fatal("Alive after Kill")
	}
	var ee *exec.ExitError
	if err := p.Err(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("Err = %v, want killed by SIGKILL", err)
	}
}

func TestStopIsPoliteFirst(t *testing.T) {
	t.Parallel()
	t.Run("exits on SIGTERM", func(t *testing.T) {
		t.Parallel()
		p := start(t, sh(t, `trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done`))
		waitFor(t, "ready", func() bool { return strings.Contains(output(t, p), "ready") })
		if err := p.Stop(5 * time.Second); err != nil {
			t.Fatalf("Stop = %v, want a clean exit", err)
		}
		if !strings.Contains(output(t, p), "bye") {
			t.Fatal("the SIGTERM handler did not run")
		}
	})
	t.Run("killed after the timeout", func(t *testing.T) {
		t.Parallel()
		p := start(t, sh(t, `trap '' TERM; echo ready; while :; do sleep 0.05; done`))
		waitFor(t, "ready", func() bool { return strings.Contains(output(t, p), "ready") })
		start := time.Now()
		err := p.Stop(300 * time.Millisecond)
		if err == nil || !strings.Contains(err.Error(), "killed") {
			t.Fatalf("Stop = %v, want an error saying it was killed", err)
		}
		if p.Alive() || time.Since(start) < 300*time.Millisecond {
			t.Fatal("Stop returned before the timeout or left the process alive")
		}
	})
	t.Run("reaches a paused process", func(t *testing.T) {
		t.Parallel()
		p := start(t, sh(t, `trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done`))
		waitFor(t, "ready", func() bool { return strings.Contains(output(t, p), "ready") })
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "stopped state", func() bool { return procState(t, p.Pid()) == "T" })
		if err := p.Stop(5 * time.Second); err != nil {
			t.Fatalf("Stop of a paused process = %v, want a clean exit", err)
		}
	})
}

func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	p := start(t, sh(t, `i=0; while :; do i=$((i+1)); echo "tick $i"; sleep 0.02; done`))
	ticks := func() int { return strings.Count(output(t, p), "tick ") }
	waitFor(t, "ticks", func() bool { return ticks() > 2 })
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stopped state", func() bool { return procState(t, p.Pid()) == "T" })
	paused := ticks()
	time.Sleep(200 * time.Millisecond)
	if got := ticks(); got != paused {
		t.Fatalf("a paused process wrote %d more lines", got-paused)
	}
	if !p.Alive() {
		t.Fatal("a paused process is alive")
	}
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ticks after SIGCONT", func() bool { return ticks() > paused+2 })
}

func TestRestartRunsAgainWithANewPid(t *testing.T) {
	t.Parallel()
	p := start(t, sh(t, `echo "run $$"; sleep 30`))
	waitFor(t, "first run", func() bool { return strings.Count(output(t, p), "run ") == 1 })
	first := p.Pid()
	p.Kill()
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	if p.Pid() == first || !p.Alive() || p.Starts() != 2 {
		t.Fatalf("after Restart: pid %d (was %d), alive %v, starts %d", p.Pid(), first, p.Alive(), p.Starts())
	}
	waitFor(t, "second run", func() bool { return strings.Count(output(t, p), "run ") == 2 })
	// Restart of a running process stops it first.
	second := p.Pid()
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	if p.Pid() == second || p.Starts() != 3 {
		t.Fatalf("Restart of a running process: pid %d (was %d), starts %d", p.Pid(), second, p.Starts())
	}
	if err := syscall.Kill(second, 0); err == nil {
		t.Fatalf("pid %d still exists after Restart", second)
	}
	if log := readLog(t, p); !strings.Contains(log, "start 3 of sh") {
		t.Fatalf("log lacks the third start:\n%s", log)
	}
}

func TestWaitHonoursTheContext(t *testing.T) {
	t.Parallel()
	p := start(t, sh(t, `sleep 30`))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want the context's deadline", err)
	}
	if !p.Alive() {
		t.Fatal("Wait's deadline ended the process")
	}
}

func TestBuildCompilesMainsIntoADirectory(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs go build")
	}
	dir := t.TempDir()
	bins, err := procs.Build(context.Background(), dir, "./testdata/hello")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "hello"); len(bins) != 1 || bins[0] != want {
		t.Fatalf("Build = %v, want [%s]", bins, want)
	}
	p := start(t, procs.Spec{Path: bins[0], Args: []string{"a", "b"}, Env: []string{"HELLO_ENV=c"}, LogFile: filepath.Join(dir, "hello.log")})
	var ee *exec.ExitError
	if err := p.Wait(context.Background()); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("hello exited with %v, want status 3", err)
	}
	if p.Name() != "hello" || !strings.Contains(readLog(t, p), "hello a b c\n") {
		t.Fatalf("name %q, log:\n%s", p.Name(), readLog(t, p))
	}
	if _, err := procs.Build(context.Background(), dir, "./testdata/missing"); err == nil {
		t.Fatal("Build of a missing package succeeded")
	}
}
