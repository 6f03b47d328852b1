// Command bench measures sqlfence/cluster beside its peers, in one process
// and one run, and draws the results. It is its own module, so that library
// users never download the peers (client-go, etcd, gonum/plot). See
// BENCHMARKS.md at the repository root for the tables and how to read them.
//
//	go run . compare   # IsLeader ns/op, handoff, crash takeover, fenced transactions
//	go run . scale     # N members in one process against one PostgreSQL
//	go run . plot      # PNGs under plots/ from the JSON under results/
//	go run . traces    # the steps of the handoffs of a traced compare run
//	go run . pool      # the trials of several compare runs together
//
// Every subcommand takes -h. Each run is bounded: a few minutes on a 2-core
// machine with the defaults.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

const usage = `usage: go run . <command> [flags]

commands:
  compare  leadership-check ns/op, handoff and crash takeover over trials,
           and the cost of a fenced transaction, for this package and its peers
  scale    N members in one process against one PostgreSQL (directly or
           through a PgBouncer of its own)
  plot     PNG plots under plots/ from the JSON under results/
  traces   the steps of each handoff of a compare run traced with
           BENCH_TRACE=1 (its standard error saved to a file), medians
  pool     the percentiles of the trials of several compare runs together
           (their handoff.json or takeover.json files)

Run "go run . <command> -h" for a command's flags.
`

func main() {
	if spec := os.Getenv(memberEnv); spec != "" {
		runChild("member", spec, runMember) // a member process of compare -procs
		return
	}
	if spec := os.Getenv(probeEnv); spec != "" {
		runChild("probe", spec, runProbe) // the probe process of scale -probe
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	// client-go logs every attempt through klog; the peers' logs are not
	// what is measured.
	klog.SetLogger(logr.Discard())
	klog.SetOutput(io.Discard)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "compare":
		err = compare(ctx, args)
	case "scale":
		err = scale(ctx, args)
	case "plot":
		err = plots(args)
	case "traces":
		err = traces(args)
	case "pool":
		err = pool(args)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(os.Stdout, usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "bench: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// quietLogger is the cluster members' logger: errors only, unless -v.
func quietLogger(verbose bool) *slog.Logger {
	level := slog.LevelError + 1 // a crash trial's renew failures are expected
	if verbose {
		level = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// runChild runs the bench as a child process of itself (what names it in
// errors) with the configuration spec, until run returns or the process
// is interrupted, and exits with status 1 on an error.
func runChild(what, spec string, run func(context.Context, string) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, spec)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", what, err)
		os.Exit(1)
	}
}
