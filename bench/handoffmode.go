package main

import (
	"fmt"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
)

// PostgreSQL handoff modes for -pg-handoff. With "poll" followers do not
// LISTEN (Config.PollOnly): a follower learns of a released lease at its
// next attempt, within one heartbeat (each member has a provider of its
// own, so none hears another's release in memory either). With "notify"
// the release's NOTIFY wakes the followers at once, in this process or
// others: they LISTEN through clusterpgx's providers (NewStdlibProvider
// for the database/sql members, NewProvider for pgx).
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
		return "", func(c *cluster.Config) error {
			c.PollOnly = true
			return nil
		}, nil
	case pgHandoffNotify:
		return "+notify", func(c *cluster.Config) error {
			if c.Provider == nil && c.DB != nil {
				p, err := clusterpgx.NewStdlibProvider(c.DB, c.TablePrefix)
				if err != nil {
					return err
				}
				c.Provider = p
			}
			return nil
		}, nil
	}
	return "", nil, fmt.Errorf("-pg-handoff %q: want %q or %q", mode, pgHandoffPoll, pgHandoffNotify)
}
