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
	faultRestart   = "restart"   // SIGKILL and a restart within a fifth of the TTL: the new process meets its predecessor's unexpired term
	faultPause     = "pause"     // SIGSTOP for longer than the TTL, then SIGCONT
	faultPartition = "partition" // the node's proxy blackholes one or both directions
	faultLatency   = "latency"   // the node's proxy delays every chunk, near the renew deadline
	faultReset     = "reset"     // the node's proxy resets every connection
	faultDBKill    = "dbkill"    // the server ends the node's sessions
	faultClock     = "clock"     // a clean restart with the node's wall clock set off
	faultResign    = "resign"    // the node resigns (SIGUSR1 makes it call Resign)
	faultSlowCut   = "slow-cut"  // latency near the renew deadline, then a partition both ways while it lasts
	faultRelease   = "release"   // an operator ends the leader's term (DBProvider.ForceRelease, as clusterctl release -force): its writes in flight must commit before the release or not at all
)

// allFaults lists every kind, in the order reports show them.
var allFaults = []string{faultKill, faultRestart, faultPause, faultPartition, faultLatency, faultReset, faultDBKill, faultClock, faultResign, faultSlowCut, faultRelease}

// faultKinds lists the kinds drawn by default on a dialect and stack:
// SQLite nodes share a file, so they have no proxy and no server
// sessions. Resigns are drawn on the pgx stack, whose releases name a
// successor that hears them; elsewhere they can be asked for with -faults
// (drawing them by default would change the schedules of known seeds).
func faultKinds(d cluster.Dialect, stack string) []string {
	switch {
	case d == cluster.SQLite:
		return []string{faultKill, faultRestart, faultPause, faultClock, faultRelease}
	case stack == stackPgx:
		return []string{faultKill, faultRestart, faultPause, faultPartition, faultLatency, faultReset, faultDBKill, faultClock, faultResign, faultRelease, faultSlowCut}
	}
	return []string{faultKill, faultRestart, faultPause, faultPartition, faultLatency, faultReset, faultDBKill, faultClock, faultRelease, faultSlowCut}
}

// weight is how often a kind is drawn relative to the others.
var weight = map[string]int{
	faultKill: 2, faultRestart: 2, faultPause: 2, faultPartition: 3, faultLatency: 2, faultReset: 1, faultDBKill: 1, faultClock: 1, faultResign: 2, faultSlowCut: 2, faultRelease: 2,
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
	Delay    time.Duration // latency, slow-cut: one-way delay per chunk
	Jitter   time.Duration
	Cut      time.Duration // slow-cut: when, within Hold, the partition begins
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
	case faultSlowCut:
		return fmt.Sprintf("%s %s %v±%v, cut after %v, for %v", s.Kind, aim, s.Delay.Round(time.Millisecond), s.Jitter.Round(time.Millisecond),
			s.Cut.Round(time.Millisecond), s.Hold.Round(time.Millisecond))
	case faultClock:
		return fmt.Sprintf("%s %s offset %v", s.Kind, aim, s.Offset)
	case faultReset, faultDBKill, faultRelease:
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
// With cover, the schedule draws every kind: a kind missing from the draw
// replaces a step of the most frequent kind while one is drawn twice, and
// is added as a step of its own after that (a short run would otherwise
// draw no pause, or no latency, for a dialect). Without it, the draw is
// the plain one of the seed and the kinds (the default kinds grew restart,
// release and slow-cut, so seeds drawn before them now give other
// schedules).
func schedule(rng *rand.Rand, kinds []string, nodes int, tm timings, d time.Duration, leaderShare float64, cover bool) []step {
	total := 0
	for _, k := range kinds {
		total += weight[k]
	}
	var out []step
	var used time.Duration
	for used < d {
		s := step{Rest: between(rng, 1, 2, tm.TTL)}
		r := rng.IntN(total)
		for _, k := range kinds {
			if r -= weight[k]; r < 0 {
				s.Kind = k
				break
			}
		}
		s.Leader = rng.Float64() < leaderShare
		s.Fallback = rng.IntN(nodes)
		drawParams(rng, &s, tm)
		used += s.Rest + s.Hold
		out = append(out, s)
	}
	if cover {
		for _, k := range kinds {
			n := map[string]int{}
			for _, s := range out {
				n[s.Kind]++
			}
			if n[k] > 0 {
				continue
			}
			most := 0
			for i, s := range out {
				if n[s.Kind] > n[out[most].Kind] {
					most = i
				}
			}
			if n[out[most].Kind] < 2 {
				// Every step has a kind of its own: one more step, so
				// the schedule runs a little past d.
				s := step{Rest: between(rng, 1, 2, tm.TTL), Kind: k, Leader: rng.Float64() < leaderShare, Fallback: rng.IntN(nodes)}
				drawParams(rng, &s, tm)
				out = append(out, s)
				continue
			}
			out[most].Kind = k
			out[most].Hold, out[most].Up, out[most].Down, out[most].Delay, out[most].Jitter, out[most].Offset, out[most].Cut = 0, false, false, 0, 0, 0, 0
			drawParams(rng, &out[most], tm)
		}
	}
	return out
}

// between draws a duration uniformly between lo and hi units.
func between(rng *rand.Rand, lo, hi float64, unit time.Duration) time.Duration {
	return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(unit))
}

// drawParams draws how long fault s lasts and how it acts, by its kind.
func drawParams(rng *rand.Rand, s *step, tm timings) {
	switch s.Kind {
	case faultKill:
		s.Hold = between(rng, 0.3, 2, tm.TTL)
	case faultRestart:
		s.Hold = between(rng, 0, 0.2, tm.TTL)
	case faultPause:
		s.Hold = between(rng, 1.2, 2.5, tm.TTL)
	case faultPartition:
		s.Hold = between(rng, 0.5, 2.5, tm.TTL)
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
		s.Hold = between(rng, 1, 3, tm.TTL)
		s.Delay = between(rng, 0.25, 0.55, tm.FenceTimeout-tm.Heartbeat)
		s.Jitter = s.Delay / 4
	case faultSlowCut:
		// A slow answer to a renew that still succeeds, then nothing: the
		// belief that answer bought must still end the margin before the
		// next grant. The cut comes after one or two renews under the
		// delay; it lasts past the TTL, so the lease expires.
		// The delay is most of what a renew's round trip may take and
		// still succeed (FenceTimeout - HeartbeatInterval, less a tenth):
		// the slower the answer, the more a wrong trust window gains.
		s.Delay = between(rng, 0.3, 0.4, tm.FenceTimeout-tm.Heartbeat)
		s.Jitter = s.Delay / 8
		s.Cut = between(rng, 1, 2, tm.Heartbeat) + 2*s.Delay
		s.Hold = s.Cut + between(rng, 1.2, 2, tm.TTL)
	case faultRelease:
		// A heartbeat: time for the leader to see its renew fail.
		s.Hold = tm.Heartbeat
	case faultResign:
		// Long enough for the handoff to finish within the fault, so
		// the report's failover times include it.
		s.Hold = tm.Heartbeat
	case faultClock:
		s.Offset = between(rng, 60, 48*3600, time.Second).Round(time.Second)
		if rng.IntN(2) == 0 {
			s.Offset = -s.Offset
		}
	}
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
