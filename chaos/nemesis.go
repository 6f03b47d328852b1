package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/sqlfence/cluster"
)

// Fault kinds.
const (
	faultKill      = "kill"      // SIGKILL, then a restart after the hold
	faultPause     = "pause"     // SIGSTOP for longer than the TTL, then SIGCONT
	faultPartition = "partition" // the node's proxy blackholes one or both directions
	faultLatency   = "latency"   // the node's proxy delays every chunk, near the renew deadline
	faultReset     = "reset"     // the node's proxy resets every connection
	faultDBKill    = "dbkill"    // the server ends the node's sessions
	faultClock     = "clock"     // a clean restart with the node's wall clock set off
	faultResign    = "resign"    // the node resigns (SIGUSR1 makes it call Resign)
)

// allFaults lists every kind, in the order reports show them.
var allFaults = []string{faultKill, faultPause, faultPartition, faultLatency, faultReset, faultDBKill, faultClock, faultResign}

// faultKinds lists the kinds drawn by default on a dialect and stack:
// SQLite nodes share a file, so they have no proxy and no server
// sessions. Resigns are drawn on the pgx stack, whose releases name a
// successor that hears them; elsewhere they can be asked for with -faults
// (drawing them by default would change the schedules of known seeds).
func faultKinds(d cluster.Dialect, stack string) []string {
	switch {
	case d == cluster.SQLite:
		return []string{faultKill, faultPause, faultClock}
	case stack == stackPgx:
		return []string{faultKill, faultPause, faultPartition, faultLatency, faultReset, faultDBKill, faultClock, faultResign}
	}
	return []string{faultKill, faultPause, faultPartition, faultLatency, faultReset, faultDBKill, faultClock}
}

// weight is how often a kind is drawn relative to the others.
var weight = map[string]int{
	faultKill: 2, faultPause: 2, faultPartition: 3, faultLatency: 2, faultReset: 1, faultDBKill: 1, faultClock: 1, faultResign: 2,
}

// A step is one fault of the schedule. Everything in it is drawn from the
// seed before the experiment starts; only which node leads when a step
// targets the leader is learnt at run time.
type step struct {
	Rest     time.Duration // quiet time before the fault
	Kind     string
	Leader   bool          // aim at the current leader (else at Fallback)
	Fallback int           // node index when not aiming at the leader, or when none leads
	Hold     time.Duration // how long the fault lasts; 0 for instant faults
	Up, Down bool          // partition directions (client to server, server to client)
	Delay    time.Duration // latency: one-way delay per chunk
	Jitter   time.Duration
	Offset   time.Duration // clock: the wall-clock offset of the restarted node
}

func (s step) String() string {
	aim := fmt.Sprintf("n%d", s.Fallback+1)
	if s.Leader {
		aim = "leader"
	}
	switch s.Kind {
	case faultPartition:
		dir := "both"
		if !s.Down {
			dir = "to-db"
		} else if !s.Up {
			dir = "from-db"
		}
		return fmt.Sprintf("%s %s %s for %v", s.Kind, aim, dir, s.Hold.Round(time.Millisecond))
	case faultLatency:
		return fmt.Sprintf("%s %s %v±%v for %v", s.Kind, aim, s.Delay.Round(time.Millisecond), s.Jitter.Round(time.Millisecond), s.Hold.Round(time.Millisecond))
	case faultClock:
		return fmt.Sprintf("%s %s offset %v", s.Kind, aim, s.Offset)
	case faultReset, faultDBKill:
		return fmt.Sprintf("%s %s", s.Kind, aim)
	}
	return fmt.Sprintf("%s %s for %v", s.Kind, aim, s.Hold.Round(time.Millisecond))
}

// timings are the cluster's, which the schedule is scaled to.
type timings struct {
	TTL, Heartbeat, FenceTimeout time.Duration
}

// schedule draws faults from rng until they fill d. kinds are the kinds
// allowed; leaderShare is the probability that a fault aims at the leader.
func schedule(rng *rand.Rand, kinds []string, nodes int, tm timings, d time.Duration, leaderShare float64) []step {
	total := 0
	for _, k := range kinds {
		total += weight[k]
	}
	between := func(lo, hi float64, unit time.Duration) time.Duration {
		return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(unit))
	}
	var out []step
	var used time.Duration
	for used < d {
		s := step{Rest: between(1, 2, tm.TTL)}
		r := rng.IntN(total)
		for _, k := range kinds {
			if r -= weight[k]; r < 0 {
				s.Kind = k
				break
			}
		}
		s.Leader = rng.Float64() < leaderShare
		s.Fallback = rng.IntN(nodes)
		switch s.Kind {
		case faultKill:
			s.Hold = between(0.3, 2, tm.TTL)
		case faultPause:
			s.Hold = between(1.2, 2.5, tm.TTL)
		case faultPartition:
			s.Hold = between(0.5, 2.5, tm.TTL)
			switch rng.IntN(3) {
			case 0:
				s.Up, s.Down = true, true
			case 1:
				s.Up = true
			default:
				s.Down = true
			}
		case faultLatency:
			// A round trip of about FenceTimeout - HeartbeatInterval is
			// what the first renew after a success has before its trust
			// window ends: aim around it, on both sides.
			s.Hold = between(1, 3, tm.TTL)
			s.Delay = between(0.25, 0.55, tm.FenceTimeout-tm.Heartbeat)
			s.Jitter = s.Delay / 4
		case faultResign:
			// Long enough for the handoff to finish within the fault, so
			// the report's failover times include it.
			s.Hold = tm.Heartbeat
		case faultClock:
			s.Offset = between(60, 48*3600, time.Second).Round(time.Second)
			if rng.IntN(2) == 0 {
				s.Offset = -s.Offset
			}
		}
		used += s.Rest + s.Hold
		out = append(out, s)
	}
	return out
}

// allowed reports whether every kind is one the dialect can take: those
// drawn by default on it, and resigns anywhere.
func allowed(d cluster.Dialect, stack string, kinds []string) error {
	avail := faultKinds(d, stack)
	if !slices.Contains(avail, faultResign) {
		avail = append(avail, faultResign)
	}
	for _, k := range kinds {
		if !slices.Contains(avail, k) {
			return fmt.Errorf("fault %q is not available on %s (available: %v)", k, d, avail)
		}
	}
	return nil
}
