package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuUse is where the CPU went during a window, in cores (CPU seconds
// per second): this process, the PgBouncer it started, the PostgreSQL
// backends serving it, and the whole machine, other engineers' work
// included. Read from /proc; zero where it cannot be read.
type cpuUse struct {
	Bench     float64 `json:"bench"`
	PgBouncer float64 `json:"pgbouncer,omitempty"`
	Backends  float64 `json:"postgresBackends"`
	Machine   float64 `json:"machineBusy"` // of all cores
}

// cpuSample is a reading of the counters behind cpuUse.
type cpuSample struct {
	at       time.Time
	self     time.Duration
	bouncer  time.Duration
	backends map[int]time.Duration
	busy     time.Duration // the machine's non-idle time, all cores
}

func takeCPU(bouncerPid int, backendPids []int) cpuSample {
	s := cpuSample{at: time.Now(), backends: map[int]time.Duration{}}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if bouncerPid > 0 {
		s.bouncer = procCPU(bouncerPid)
	}
	for _, pid := range backendPids {
		s.backends[pid] = procCPU(pid)
	}
	s.busy = machineBusy()
	return s
}

// use returns the CPU used between s and a later sample e; backends
// count when both samples saw them.
func (s cpuSample) use(e cpuSample) cpuUse {
	secs := e.at.Sub(s.at).Seconds()
	var backends time.Duration
	for pid, t := range e.backends {
		if t0, ok := s.backends[pid]; ok {
			backends += t - t0
		}
	}
	return cpuUse{
		Bench:     (e.self - s.self).Seconds() / secs,
		PgBouncer: (e.bouncer - s.bouncer).Seconds() / secs,
		Backends:  backends.Seconds() / secs,
		Machine:   (e.busy - s.busy).Seconds() / secs,
	}
}

// clockTick is USER_HZ, the unit of /proc's CPU times: 100 on Linux.
const clockTick = 100

// procCPU is a process's user and system time, from /proc/pid/stat.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: count fields
	// after its closing parenthesis (state is field 3, utime 14, stime 15).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+k) * time.Second / clockTick
}

// machineBusy is the non-idle time of all cores, from /proc/stat.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 && i < 8 { // not idle, not iowait; guest time is in user already
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / clockTick
}
