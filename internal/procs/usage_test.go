package procs

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
	// A machine busy throughout has no idle ticks between the readings, and
	// the two differences are then equal but for rounding in the last bit.
	if busy1-busy0 > all1-all0+1e-9 {
		t.Errorf("busy +%.2fs above all +%.2fs", busy1-busy0, all1-all0)
	}
}

// Threads that outnumber the cores wait for one: spinning nproc+1 threads
// at once for a while, this process's run-queue wait grows by at least what
// the extra thread could not run, and its CPU plus its wait add up to about
// the time its spinning threads were runnable.
func TestRunQueueWaitCountsTimeWithoutACore(t *testing.T) {
	pid := os.Getpid()
	wait0, err := RunQueueWait(pid)
	if err != nil {
		t.Fatal(err)
	}
	cpu0, _ := CPUSeconds(pid)
	cores := runtime.NumCPU()
	threads, spin := cores+1, 400*time.Millisecond
	// A P for every spinning thread: with fewer, Go parks the extra
	// thread itself, and the kernel never sees it waiting.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(threads + 1))
	var spun sync.WaitGroup
	var sink atomic.Int64
	spans := make([]time.Duration, threads) // how long each thread spun
	lives := make([]time.Duration, threads) // from start to the end of its spin
	release := make(chan struct{})
	start := time.Now()
	for k := range threads {
		spun.Add(1)
		go func() {
			// The thread, not only the goroutine, stays runnable; it
			// lives until it is read (an exited thread's wait is gone).
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			began, x := time.Now(), int64(0)
			for time.Since(start) < spin {
				for i := range 100_000 {
					x += int64(i)
				}
			}
			spans[k], lives[k] = time.Since(began), time.Since(start)
			sink.Add(x)
			spun.Done()
			<-release
		}()
	}
	spun.Wait()
	wait1, err := RunQueueWait(pid)
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	cpu1, _ := CPUSeconds(pid)
	wait, cpu := wait1-wait0, cpu1-cpu0
	// At most cores threads run at once, so the others wait at least
	// (threads-cores) × spin between them; half of it leaves room for
	// threads that start late.
	if least := float64(threads-cores) * spin.Seconds() / 2; wait < least {
		t.Errorf("run-queue wait +%.3fs with %d threads spinning %s on %d cores, want at least %.3fs", wait, threads, spin, cores, least)
	}
	// Runnable time is CPU plus wait: at least the time the threads spun,
	// each from its first instruction to its last, and at most the time
	// from their start to that last instruction: a new thread is runnable,
	// and waits for a core, before its first instruction, which on a busy
	// machine takes a while (plus what the rest of the process did
	// meanwhile, which is little).
	var least, most float64
	for k := range threads {
		least += spans[k].Seconds()
		most += lives[k].Seconds()
	}
	if runnable := cpu + wait; runnable < least*0.75 || runnable > most*1.2 {
		t.Errorf("CPU +%.3fs and wait +%.3fs make %.3fs runnable; %d threads spun %.3fs in all, %.3fs from their start (x%d)",
			cpu, wait, runnable, threads, least, most, sink.Load())
	}
	if _, err := RunQueueWait(1 << 30); err == nil {
		t.Error("RunQueueWait of no process: no error")
	}
}

// A thread that sleeps a hundred times gives up its core at least a hundred
// times: ContextSwitches counts them, over every thread of the process.
func TestContextSwitchesCountsAThreadsSleeps(t *testing.T) {
	before, err := ContextSwitches(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // its sleeps are this thread's, not a goroutine's parked on another
		defer runtime.UnlockOSThread()
		for range 100 {
			time.Sleep(time.Millisecond)
		}
	}()
	<-done
	after, err := ContextSwitches(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 100 {
		t.Errorf("%v context switches over 100 sleeps of a thread, want at least 100", after-before)
	}
	if _, err := ContextSwitches(1 << 30); err == nil {
		t.Error("ContextSwitches of no process: no error")
	}
}
