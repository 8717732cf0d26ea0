package procs

import (
	"os"
	"testing"
)

// The test process's own CPU time and memory read from /proc; a process
// that does not exist reads as an error and 0.
func TestUsageOfAProcess(t *testing.T) {
	t.Parallel()
	x := 0
	for i := range 20_000_000 { // some CPU time of its own
		x += i
	}
	if cpu, err := CPUSeconds(os.Getpid()); err != nil || cpu <= 0 {
		t.Errorf("CPUSeconds(self) = %v, %v; want a positive time (x=%d)", cpu, err, x)
	}
	if rss := MemMB(os.Getpid(), "VmRSS"); rss <= 0 {
		t.Errorf("MemMB(self, VmRSS) = %v, want positive", rss)
	}
	rss := MemMB(os.Getpid(), "VmRSS") // read first: the peak read after it is at least as large
	if hwm := MemMB(os.Getpid(), "VmHWM"); hwm < rss {
		t.Errorf("peak %v MiB below resident %v MiB", hwm, rss)
	}
	if _, err := CPUSeconds(1 << 30); err == nil {
		t.Error("CPUSeconds of no process: no error")
	}
	if m := MemMB(1<<30, "VmRSS"); m != 0 {
		t.Errorf("MemMB of no process = %v, want 0", m)
	}
}
