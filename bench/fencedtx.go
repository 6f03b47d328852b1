package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
)

// fenceResult compares one transaction with and without Fence:
//
//	unfenced: BEGIN; INSERT; COMMIT
//	fenced:   BEGIN; Fence; INSERT (the token); COMMIT
//
// Rounds alternate the two (the order flips every round), so that a
// neighbour's load lands on both alike; the figures are medians of the
// per-round figures.
type fenceResult struct {
	System      string    `json:"system"`
	Rounds      int       `json:"rounds"`
	RoundMs     float64   `json:"roundMs"` // how long each side of a round runs
	UnfencedUs  []float64 `json:"unfencedUs"`
	FencedUs    []float64 `json:"fencedUs"`
	Ratio       []float64 `json:"ratio"`
	MedUnfenced float64   `json:"medianUnfencedUs"`
	MedFenced   float64   `json:"medianFencedUs"`
	MedRatio    float64   `json:"medianRatio"`
	Errors      int       `json:"errors"` // failed transactions (a lost lease on a busy machine), retried
}

type fenceOptions struct {
	rounds int
	round  time.Duration
	log    func(string, ...any)
}

// benchFence runs one leading member of this package on tg and measures
// the application's transactions beside it, on a pool of their own.
func benchFence(ctx context.Context, tg target, o fenceOptions, so sqlfenceOptions) (fenceResult, error) {
	res := fenceResult{System: tg.name, Rounds: o.rounds, RoundMs: ms(o.round)}
	so.members, so.conns, so.lease = 1, 2, "fence"
	sys, err := newSQLFence(tg, so)
	if err != nil {
		return res, err
	}
	defer sys.close(context.WithoutCancel(ctx))
	if err := sys.start(ctx, 0); err != nil {
		return res, err
	}
	if err := waitTrue(func() bool { return sys.leads(0) }, 10*time.Second); err != nil {
		return res, err
	}
	c := sys.cluster(0)

	table := tg.prefix + "fenced_rows"
	ddl := "CREATE TABLE " + table + " (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, fencing_token BIGINT NOT NULL, payload VARCHAR(64) NOT NULL)"
	insert := "INSERT INTO " + table + " (fencing_token, payload) VALUES ($1, $2)"
	switch tg.dialect {
	case cluster.MySQL:
		ddl = "CREATE TABLE " + table + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, fencing_token BIGINT NOT NULL, payload VARCHAR(64) NOT NULL) ENGINE=InnoDB"
		insert = "INSERT INTO " + table + " (fencing_token, payload) VALUES (?, ?)"
	case cluster.SQLite:
		ddl = "CREATE TABLE " + table + " (id INTEGER PRIMARY KEY, fencing_token INTEGER NOT NULL, payload TEXT NOT NULL)"
		insert = "INSERT INTO " + table + " (fencing_token, payload) VALUES (?, ?)"
	}
	if _, err := sys.admin.ExecContext(ctx, ddl); err != nil {
		return res, fmt.Errorf("create %s: %w", table, err)
	}
	defer sys.admin.ExecContext(context.WithoutCancel(ctx), "DROP TABLE "+table)

	unfenced, fenced, closeApp, err := fenceOps(ctx, tg, c, insert)
	if err != nil {
		return res, err
	}
	defer closeApp()

	// run repeats op for d and returns µs per transaction.
	run := func(op func() error, d time.Duration) (float64, error) {
		n, start := 0, time.Now()
		for time.Since(start) < d {
			if err := op(); err != nil {
				if errors.Is(err, cluster.ErrStaleFencingToken) || errors.Is(err, cluster.ErrNotLeader) {
					// A renew starved on a busy machine: wait for the next term.
					res.Errors++
					if err := waitTrue(c.IsLeader, 10*time.Second); err != nil {
						return 0, fmt.Errorf("lost the lease and never led again: %w", err)
					}
					start, n = time.Now(), 0
					continue
				}
				return 0, err
			}
			n++
		}
		return float64(time.Since(start).Microseconds()) / float64(n), nil
	}
	// Warm both paths: connections, statement caches.
	if _, err := run(unfenced, o.round/4); err != nil {
		return res, err
	}
	if _, err := run(fenced, o.round/4); err != nil {
		return res, err
	}
	for r := range o.rounds {
		var u, f float64
		if r%2 == 0 {
			if u, err = run(unfenced, o.round); err == nil {
				f, err = run(fenced, o.round)
			}
		} else {
			if f, err = run(fenced, o.round); err == nil {
				u, err = run(unfenced, o.round)
			}
		}
		if err != nil {
			return res, err
		}
		res.UnfencedUs = append(res.UnfencedUs, u)
		res.FencedUs = append(res.FencedUs, f)
		res.Ratio = append(res.Ratio, f/u)
		if o.log != nil {
			o.log("%s fenced tx round %d/%d: unfenced %.0fµs, fenced %.0fµs, ×%.2f", tg.name, r+1, o.rounds, u, f, f/u)
		}
	}
	res.MedUnfenced, res.MedFenced, res.MedRatio = median(res.UnfencedUs), median(res.FencedUs), median(res.Ratio)
	return res, nil
}

// fenceOps returns the two transactions on the application's own pool:
// database/sql, or a pgxpool fenced through clusterpgx.
func fenceOps(ctx context.Context, tg target, c *cluster.Cluster, insert string) (unfenced, fenced func() error, closeApp func(), err error) {
	if tg.pgx {
		pool, err := pgxpool.New(ctx, tg.dsn)
		if err != nil {
			return nil, nil, nil, err
		}
		tx := func(fence bool) func() error {
			return func() error {
				tx, err := pool.Begin(ctx)
				if err != nil {
					return err
				}
				defer tx.Rollback(ctx)
				var token uint64
				if fence {
					if token, err = clusterpgx.Fence(ctx, c, tx); err != nil {
						return err
					}
				}
				if _, err := tx.Exec(ctx, insert, int64(token), "payload"); err != nil {
					return err
				}
				return tx.Commit(ctx)
			}
		}
		return tx(false), tx(true), pool.Close, nil
	}
	db, err := sql.Open(tg.driver, tg.dsn)
	if err != nil {
		return nil, nil, nil, err
	}
	db.SetMaxOpenConns(2)
	tx := func(fence bool) func() error {
		return func() error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			var token uint64
			if fence {
				if token, err = c.Fence(ctx, tx); err != nil {
					return err
				}
			}
			if _, err := tx.ExecContext(ctx, insert, int64(token), "payload"); err != nil {
				return err
			}
			return tx.Commit()
		}
	}
	return tx(false), tx(true), func() { db.Close() }, nil
}
