package main

import (
	"time"

	"golang.org/x/sys/unix"
)

// The experiment's clock. Every timestamp in a history is nanoseconds since
// the harness started, read on CLOCK_MONOTONIC, which all processes of one
// Linux host share: the harness passes its own reading at start to each
// node, and a node adds how far its own monotonic clock has moved since it
// read the same clock once. No wall clock is consulted, so a node whose
// wall clock is set off (the clock fault) records the same times as the
// others. This assumes the nodes and the harness run on one host.

// A clock turns this process's monotonic clock into experiment time.
type clock struct {
	base  int64     // experiment time at anchor
	start time.Time // anchor; time.Since reads the monotonic clock
}

// monotonicNow reads CLOCK_MONOTONIC in nanoseconds.
func monotonicNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("chaos: CLOCK_MONOTONIC: " + err.Error()) // Linux always has it
	}
	return ts.Nano()
}

// newClock returns a clock for an experiment whose harness read
// CLOCK_MONOTONIC as origin when it started.
func newClock(origin int64) *clock {
	start := time.Now()
	return &clock{base: monotonicNow() - origin, start: start}
}

// now is the experiment time in nanoseconds.
func (c *clock) now() int64 { return c.base + int64(time.Since(c.start)) }
