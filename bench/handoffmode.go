package main

import (
	"fmt"

	"github.com/sqlfence/cluster"
)

// PostgreSQL handoff modes for -pg-handoff. A follower of this package
// learns of a released lease at its next attempt, within one heartbeat
// ("poll"). A LISTEN/NOTIFY handoff, in which the release wakes the
// followers at once, is being added to the library; "notify" is where it
// is switched on, so that the PostgreSQL handoff trials can be run again
// with one command once it lands:
//
//	go run . compare -only handoff -systems postgres,pgx -pg-handoff notify
//
// Results carry the mode in the system's name ("postgres+notify") and the
// library's commit, so figures from before and after stay apart.
const (
	pgHandoffPoll   = "poll"
	pgHandoffNotify = "notify"
)

// pgHandoffMode returns the label suffix and the Config change for mode,
// applied to PostgreSQL members only (postgres and pgx).
func pgHandoffMode(mode string) (suffix string, configure func(*cluster.Config) error, err error) {
	switch mode {
	case pgHandoffPoll:
		return "", nil, nil
	case pgHandoffNotify:
		return "+notify", func(*cluster.Config) error {
			// Set the library's switch for LISTEN/NOTIFY handoff here once it
			// exists. Until then this mode refuses to run rather than
			// measure polling under the wrong name.
			return fmt.Errorf("-pg-handoff %s: this build of the library has no LISTEN/NOTIFY handoff yet (see handoffmode.go)", mode)
		}, nil
	}
	return "", nil, fmt.Errorf("-pg-handoff %q: want %q or %q", mode, pgHandoffPoll, pgHandoffNotify)
}
