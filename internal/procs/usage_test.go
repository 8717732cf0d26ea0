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

// The machine's busy time grows by at least the CPU time this process spends
// between two readings, and never exceeds all of the machine's time.
func TestMachineCPUCountsThisProcess(t *testing.T) {
	busy0, all0, err := MachineCPU()
	if err != nil {
		t.Fatal(err)
	}
	self0, _ := CPUSeconds(os.Getpid())
	self1, x := self0, 0
	for self1 < self0+0.3 { // spend 0.3 s of CPU
		for i := range 10_000_000 {
			x += i
		}
		self1, _ = CPUSeconds(os.Getpid())
	}
	busy1, all1, err := MachineCPU()
	if err != nil {
		t.Fatal(err)
	}
	if spent := self1 - self0; busy1-busy0 < spent-0.02 { // ticks: 10 ms each, read at different instants
		t.Errorf("machine busy +%.2fs while this process alone spent %.2fs (x=%d)", busy1-busy0, spent, x)
	}
	if busy1-busy0 > all1-all0 {
		t.Errorf("busy +%.2fs above all +%.2fs", busy1-busy0, all1-all0)
	}
}
