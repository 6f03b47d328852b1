package main

import (
	"fmt"
	"os"
	"time"

	"github.com/sqlfence/cluster"
)

// tracing is set by $BENCH_TRACE: members of this package then write every
// provider call, as Config.Observer reports it, and the handoff's steps to
// standard error, one line each ("trace <unixnano> <member> <what> <outcome>
// start|end"), to see where a handoff's milliseconds go.
var tracing = os.Getenv("BENCH_TRACE") != ""

// traceAt writes one trace line when tracing.
func traceAt(at time.Time, member, what string) {
	if tracing {
		fmt.Fprintf(os.Stderr, "trace %d %s %s\n", at.UnixNano(), member, what)
	}
}

// traceOp writes the start and the end of provider call o.
func traceOp(member string, o cluster.Operation) {
	if tracing {
		end := time.Now()
		traceAt(end.Add(-o.Duration), member, string(o.Kind)+" "+string(o.Outcome)+" start")
		traceAt(end, member, string(o.Kind)+" "+string(o.Outcome)+" end")
	}
}
