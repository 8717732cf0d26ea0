package main

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/procs"
)

// procGroup is some of the machine's processes, counted together.
type procGroup struct {
	name string
	pids []int
}

// coreUse is how a group shared the machine's cores over a phase, per
// second of it: its CPU, and its time runnable but without a core (what a
// request to it waits before it is even read).
type coreUse struct {
	name      string
	cpu, wait float64
}

// coreMark is a reading of every group's processes' CPU and run-queue
// wait, and of the machine's CPU.
type coreMark struct {
	at        time.Time
	busy, all float64
	groups    []procGroup
	cpu, wait map[int]float64 // by pid; absent when the process is gone
}

func markCores(groups []procGroup) coreMark {
	m := coreMark{at: time.Now(), groups: groups, cpu: map[int]float64{}, wait: map[int]float64{}}
	m.busy, m.all, _ = procs.MachineCPU()
	for _, g := range groups {
		for _, pid := range g.pids {
			cpu, err1 := procs.CPUSeconds(pid)
			wait, err2 := procs.RunQueueWait(pid)
			if err1 == nil && err2 == nil {
				m.cpu[pid], m.wait[pid] = cpu, wait
			}
		}
	}
	return m
}

// since returns each group's use from m until now, per second, counting the
// processes alive at both readings, and the machine's share busy.
func (m coreMark) since() (use []coreUse, box float64) {
	n := markCores(m.groups)
	secs := n.at.Sub(m.at).Seconds()
	if n.all > m.all {
		box = (n.busy - m.busy) / (n.all - m.all)
	}
	for _, g := range m.groups {
		u := coreUse{name: g.name}
		for _, pid := range g.pids {
			c0, ok0 := m.cpu[pid]
			c1, ok1 := n.cpu[pid]
			if ok0 && ok1 && c1 >= c0 {
				u.cpu += (c1 - c0) / secs
				u.wait += (n.wait[pid] - m.wait[pid]) / secs
			}
		}
		use = append(use, u)
	}
	return use, box
}

// postgresPids are this machine's PostgreSQL processes other than skip (by
// command name; none when PostgreSQL runs elsewhere).
func postgresPids(skip int) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == skip {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/comm"); err == nil && strings.TrimSpace(string(b)) == "postgres" {
			pids = append(pids, pid)
		}
	}
	return pids
}
