package rawsock

import (
	"bytes"
	"context"
	"errors"
	"io"
	"runtime"
	"runtime/trace"
	"testing"
	"time"

	xtrace "golang.org/x/exp/trace"
)

// A Timer's sleep wakes the sleeping process once, when it is due, with no
// scheduler-visible system call; time.Sleep, the control, wakes it about
// twice (the poller's timeout is in whole milliseconds, rounded down: it
// returns early and sleeps again). Sleeps of 3.9 ms, due 0.9 ms after the
// early wake (a sleep that starts late on a busy machine does not close
// that), on one P, so that the P's wake-ups are the sleeping goroutine's.
func TestTimerWakesTheProcessOnceWhenDue(t *testing.T) {
	// Not parallel: the runtime trace is the process's.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	timer, err := NewTimer()
	if err != nil {
		t.Fatal(err)
	}
	defer timer.Close()
	const d, sleeps = 3900 * time.Microsecond, 10
	for _, tc := range []struct {
		name    string
		sleep   func(time.Duration) error
		control bool
	}{
		{"rawsock.Timer", timer.Sleep, false},
		{"time.Sleep (control)", func(d time.Duration) error { time.Sleep(d); return nil }, true},
	} {
		var out bytes.Buffer
		if err := trace.Start(&out); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			trace.Log(context.Background(), "rawsock", "conn goroutine")
			for range sleeps {
				start := time.Now()
				if err := tc.sleep(d); err != nil {
					done <- err
					return
				}
				if took := time.Since(start); took < d {
					done <- errors.New("woke after " + took.String() + ", before it was due")
					return
				}
			}
			trace.Log(context.Background(), "rawsock", "slept")
			done <- nil
		}()
		err := <-done
		trace.Stop()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var wakes int
		if n := syscallsOfConnGoroutine(t, bytes.NewReader(out.Bytes())); n != 0 && !tc.control {
			t.Errorf("%s: %d scheduler-visible system calls, want none", tc.name, n)
		}
		wakes = procWakesWhileSleeping(t, bytes.NewReader(out.Bytes()))
		if tc.control && wakes < sleeps*3/2 {
			t.Errorf("%s: the P woke %d times in %d sleeps, want about two each (else the Go runtime's poller now wakes on time, and the Timer is no longer needed)", tc.name, wakes, sleeps)
		}
		if !tc.control && wakes >= sleeps*3/2 {
			// A wake-up or two of the trace's own goroutines may fall among them.
			t.Errorf("%s: the P woke %d times in %d sleeps, want one each", tc.name, wakes, sleeps)
		}
	}
}

// A Sleep under way returns, with an error, when the Timer is closed.
func TestClosingATimerEndsItsSleep(t *testing.T) {
	timer, err := NewTimer()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- timer.Sleep(time.Hour) }()
	time.Sleep(10 * time.Millisecond) // let it sleep (if it has not yet, it fails at once)
	if err := timer.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("a Sleep of an hour returned no error when its Timer was closed")
	}
}

// procWakesWhileSleeping counts, in a runtime trace, the P's transitions
// from idle to running between the markers "conn goroutine" and "slept".
func procWakesWhileSleeping(t *testing.T, r io.Reader) int {
	t.Helper()
	counting, n := false, 0
	eachTraceEvent(t, r, func(ev xtrace.Event) {
		switch ev.Kind() {
		case xtrace.EventLog:
			if l := ev.Log(); l.Category == "rawsock" {
				counting = l.Message == "conn goroutine"
			}
		case xtrace.EventStateTransition:
			st := ev.StateTransition()
			if !counting || st.Resource.Kind != xtrace.ResourceProc {
				return
			}
			if from, to := st.Proc(); from == xtrace.ProcIdle && to == xtrace.ProcRunning {
				n++
			}
		}
	})
	return n
}
