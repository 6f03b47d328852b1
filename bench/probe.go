package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime/metrics"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// With scale -probe, a process of its own measures, while the members run,
// what a statement costs that is not theirs: it sends "SELECT 1" every few
// milliseconds through PgBouncer and straight to PostgreSQL, each on one
// connection, and sleeps a millisecond at a time to see how late it wakes.
// After the trials, each handoff and takeover gets the slowest of each
// over its interval, beside the bench process's own scheduling latency and
// GC pauses (runtime/metrics) over the same interval. A slow trial then
// says where it stalled: everything slow (the machine), the probe's
// statements both ways (the server), only through PgBouncer (the pooler),
// or none of them (the bench process, where the members run).
//
// The bench re-executes itself with the probe's configuration in
// $BENCH_PROBE; the child writes one line per sample on its standard
// output, "<path> <start unixnano> <duration ns>", and stops when its
// standard input closes.
const probeEnv = "BENCH_PROBE"

type probeSpec struct {
	Targets map[string]string `json:"targets"` // path name -> DSN
	Every   time.Duration     `json:"every"`
}

// runProbe is the probe process.
func runProbe(ctx context.Context, specJSON string) error {
	var spec probeSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return fmt.Errorf("$%s: %w", probeEnv, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// The parent closes our standard input when it is done.
		io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	emit := func(path string, start time.Time, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "%s %d %d\n", path, start.UnixNano(), d.Nanoseconds())
	}
	go func() {
		for range time.Tick(100 * time.Millisecond) {
			mu.Lock()
			out.Flush()
			mu.Unlock()
		}
	}()
	var wg sync.WaitGroup
	for path, dsn := range spec.Targets {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return fmt.Errorf("probe %s: %w", path, err)
		}
		defer conn.Close(context.Background())
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
					if ctx.Err() == nil {
						fmt.Fprintf(os.Stderr, "probe %s: %v\n", path, err)
					}
					return
				}
				emit(path, start, time.Since(start))
				time.Sleep(spec.Every)
			}
		})
	}
	wg.Go(func() {
		// How late a 1ms sleep wakes: this process has nothing else to do,
		// so lateness is the machine's (run queue, steal).
		for ctx.Err() == nil {
			start := time.Now()
			time.Sleep(time.Millisecond)
			emit("sleep", start, time.Since(start)-time.Millisecond)
		}
	})
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	return out.Flush() // the samples since the last tick
}

// probeSample is one line of the probe's output.
type probeSample struct {
	start time.Time
	d     time.Duration
}

// prober is the parent's side: it starts the probe process and keeps its
// samples.
type prober struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}

	mu      sync.Mutex
	samples map[string][]probeSample
}

func startProber(targets map[string]string, every time.Duration) (*prober, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(probeSpec{Targets: targets, Every: every})
	if err != nil {
		return nil, err
	}
	p := &prober{cmd: exec.Command(exe), done: make(chan struct{}), samples: map[string][]probeSample{}}
	p.cmd.Env = append(os.Environ(), probeEnv+"="+string(js))
	p.cmd.Stderr = os.Stderr
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 {
				continue
			}
			at, err1 := strconv.ParseInt(f[1], 10, 64)
			d, err2 := strconv.ParseInt(f[2], 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			p.mu.Lock()
			p.samples[f[0]] = append(p.samples[f[0]], probeSample{time.Unix(0, at), time.Duration(d)})
			p.mu.Unlock()
		}
	}()
	return p, nil
}

// stop ends the probe process and waits for its last samples.
func (p *prober) stop() {
	p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	p.cmd.Wait()
}

// worst returns, for each path, the longest sample that overlapped [from,
// to], in milliseconds.
func (p *prober) worst(from, to time.Time) map[string]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]float64{}
	for path, ss := range p.samples {
		// Samples are in start order per path (one goroutine each).
		i := sort.Search(len(ss), func(i int) bool { return !ss[i].start.Before(from.Add(-time.Second)) })
		w := 0.0
		for ; i < len(ss) && !ss[i].start.After(to); i++ {
			if ss[i].start.Add(ss[i].d).Before(from) {
				continue
			}
			w = max(w, ms(ss[i].d))
		}
		out[path] = w
	}
	return out
}

// runtimeStalls reads the bench process's own scheduling latencies and GC
// pauses, to take the difference over a trial.
type runtimeStalls struct {
	samples []metrics.Sample
}

const (
	schedLatencies = "/sched/latencies:seconds"
	gcPauses       = "/sched/pauses/total/gc:seconds"
)

func readRuntimeStalls() runtimeStalls {
	s := runtimeStalls{samples: []metrics.Sample{{Name: schedLatencies}, {Name: gcPauses}}}
	metrics.Read(s.samples)
	return s
}

// worstSince returns the upper bound of the highest histogram bucket that
// gained a count between s and e, for the scheduling latencies and the GC
// pauses, in milliseconds: the longest a runnable goroutine waited for a
// thread, and the longest the world stopped, within a bucket's width.
func (s runtimeStalls) worstSince(e runtimeStalls) (sched, gc float64) {
	worst := func(a, b metrics.Value) float64 {
		if a.Kind() != metrics.KindFloat64Histogram || b.Kind() != metrics.KindFloat64Histogram {
			return 0
		}
		ha, hb := a.Float64Histogram(), b.Float64Histogram()
		for i := len(hb.Counts) - 1; i >= 0; i-- {
			if i < len(ha.Counts) && hb.Counts[i] > ha.Counts[i] {
				upper := hb.Buckets[i+1]
				if math.IsInf(upper, 1) {
					upper = hb.Buckets[i]
				}
				return upper * 1000
			}
		}
		return 0
	}
	return worst(s.samples[0].Value, e.samples[0].Value), worst(s.samples[1].Value, e.samples[1].Value)
}
