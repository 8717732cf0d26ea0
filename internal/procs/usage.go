package procs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat:
// 100 on every Linux this runs on.
const clockTicks = 100

// CPUSeconds is the user plus system CPU time process pid has used, read
// from /proc (an error when the process is gone or on another machine).
func CPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
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

// MemMB reads a memory field of /proc/PID/status in MiB: VmRSS (resident
// now) or VmHWM (peak resident); 0 when it cannot be read.
func MemMB(pid int, field string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
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

// MachineCPU is the machine's CPU time so far, summed over every core, in
// seconds: busy (user, nice, system, irq, softirq, steal) and all (busy
// plus idle and iowait). The share of the machine busy between two
// readings is the ratio of their differences.
func MachineCPU() (busy, all float64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, errors.New("unreadable /proc/stat")
	}
	var ticks [8]float64
	for i := range ticks {
		if ticks[i], err = strconv.ParseFloat(f[i+1], 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
	}
	idle := ticks[3] + ticks[4]
	for _, t := range ticks {
		all += t
	}
	return (all - idle) / clockTicks, all / clockTicks, nil
}

// RunQueueWait is how long the threads of process pid have spent runnable
// but waiting for a core, in seconds: the second field of each thread's
// /proc/PID/task/TID/schedstat, summed over the threads alive now (the time
// of threads that have exited is not counted). An error when the process is
// gone, on another machine, or the kernel keeps no scheduler statistics.
func RunQueueWait(pid int) (float64, error) {
	ns, err := sumTasks(pid, "schedstat", func(b []byte) (float64, error) {
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return 0, errors.New("short /proc schedstat")
		}
		w, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return 0, fmt.Errorf("/proc schedstat: %w", err)
		}
		return w, nil
	})
	return ns / 1e9, err
}

// ContextSwitches is how many times the threads of pid alive now gave up
// or lost their core (voluntary_ctxt_switches plus nonvoluntary_ctxt_switches
// of /proc/PID/task/TID/status), summed.
func ContextSwitches(pid int) (float64, error) {
	return sumTasks(pid, "status", func(b []byte) (float64, error) {
		var n float64
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok || (k != "voluntary_ctxt_switches" && k != "nonvoluntary_ctxt_switches") {
				continue
			}
			c, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("/proc status %s: %w", k, err)
			}
			n += c
		}
		return n, nil
	})
}

// sumTasks sums what value reads from file of /proc/PID/task/TID of every
// thread of pid alive now.
func sumTasks(pid int, file string, value func([]byte) (float64, error)) (float64, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/%s", pid, t.Name(), file))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // the thread exited since the listing
			}
			return 0, err
		}
		v, err := value(b)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}
