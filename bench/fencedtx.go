package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
)

// fenceResult compares one small transaction in three forms:
//
//	unfenced: BEGIN; INSERT; COMMIT
//	read:     BEGIN; SELECT the lease row's token (no lock); INSERT; COMMIT
//	fenced:   BEGIN; Fence; INSERT (the token); COMMIT
//
// "read" is the control: one more primary-key read of the same row, so
// fenced/read is what Fence costs beyond one round trip (its row lock and
// timeouts). The forms are interleaved one transaction at a time, in an
// order that rotates, so a neighbour's burst of load lands on all alike,
// and each transaction is timed on its own. Ratios are of the medians;
// the per-round ratios show the spread.
type fenceResult struct {
	System      string    `json:"system"`
	Rounds      int       `json:"rounds"`
	RoundMs     float64   `json:"roundMs"`
	Unfenced    summary   `json:"unfenced"` // per transaction
	Read        summary   `json:"read"`
	Fenced      summary   `json:"fenced"`
	MedianRatio float64   `json:"medianRatio"`     // fenced p50 / unfenced p50
	MeanRatio   float64   `json:"meanRatio"`       // fenced mean / unfenced mean
	ReadRatio   float64   `json:"readMedianRatio"` // fenced p50 / read p50
	RoundRatios []float64 `json:"roundRatios"`     // fenced p50 / unfenced p50 within each round
	Errors      int       `json:"errors"`          // transactions that found the lease lost (a starved renew), skipped
}

type fenceOptions struct {
	rounds int
	round  time.Duration
	log    func(string, ...any)
}

// The three forms of the transaction, in fenceResult's order.
const (
	formUnfenced = iota
	formRead
	formFenced
	forms
)

// benchFence runs one leading member of this package on tg and measures
// the application's transactions beside it: through database/sql on the
// *sql.DB the member was given (Config.DB), as an application that hands
// the cluster its own pool does (then Fence runs its read through the
// statement New prepared, on SQLite and MySQL); through pgx on a pgxpool of
// their own.
func benchFence(ctx context.Context, tg target, o fenceOptions, so sqlfenceOptions) (fenceResult, error) {
	res := fenceResult{System: tg.name, Rounds: o.rounds, RoundMs: ms(o.round)}
	so.members, so.conns, so.lease = 1, 4, "fence"
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
	q := txQueries{
		insert: "INSERT INTO " + table + " (fencing_token, payload) VALUES ($1, $2)",
		read:   "SELECT fencing_token FROM " + tg.prefix + "lease WHERE name = $1",
		lease:  so.lease,
	}
	switch tg.dialect {
	case cluster.MySQL:
		ddl = "CREATE TABLE " + table + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, fencing_token BIGINT NOT NULL, payload VARCHAR(64) NOT NULL) ENGINE=InnoDB"
	case cluster.SQLite:
		ddl = "CREATE TABLE " + table + " (id INTEGER PRIMARY KEY, fencing_token INTEGER NOT NULL, payload TEXT NOT NULL)"
	}
	if tg.dialect != cluster.Postgres {
		q.insert = strings.NewReplacer("$1", "?", "$2", "?").Replace(q.insert)
		q.read = strings.ReplaceAll(q.read, "$1", "?")
	}
	if _, err := sys.admin.ExecContext(ctx, ddl); err != nil {
		return res, fmt.Errorf("create %s: %w", table, err)
	}
	defer sys.admin.ExecContext(context.WithoutCancel(ctx), "DROP TABLE "+table)

	db := sys.member(0).db.db
	if tg.ownPool {
		if db, err = sql.Open(tg.driver, tg.dsn); err != nil {
			return res, err
		}
		db.SetMaxOpenConns(2)
		defer db.Close()
	}
	plain := db
	ops, closeApp, err := txForms(ctx, tg, c, db, plain, q)
	if err != nil {
		return res, err
	}
	defer closeApp()

	var all [forms][]float64
	for r := -1; r < o.rounds; r++ { // round -1 warms connections and caches
		var got [forms][]float64
	pass:
		for i, start := 0, time.Now(); time.Since(start) < o.round; i++ {
			var d [forms]float64
			for k := range forms {
				form := (i + k) % forms
				t := time.Now()
				err := ops[form]()
				d[form] = ms(time.Since(t))
				if errors.Is(err, cluster.ErrStaleFencingToken) || errors.Is(err, cluster.ErrNotLeader) {
					// A renew starved on a busy machine: wait for the next term.
					res.Errors++
					if err := waitTrue(c.IsLeader, 10*time.Second); err != nil {
						return res, fmt.Errorf("lost the lease and never led again: %w", err)
					}
					continue pass
				}
				if err != nil {
					return res, err
				}
			}
			for form := range forms {
				got[form] = append(got[form], d[form])
			}
		}
		if r < 0 {
			continue
		}
		ratio := median(got[formFenced]) / median(got[formUnfenced])
		res.RoundRatios = append(res.RoundRatios, ratio)
		for form := range forms {
			all[form] = append(all[form], got[form]...)
		}
		if o.log != nil {
			o.log("%s fenced tx round %d/%d: %d each, p50 unfenced %.0fµs, read %.0fµs, fenced %.0fµs, ×%.2f", tg.name, r+1, o.rounds,
				len(got[formUnfenced]), 1000*median(got[formUnfenced]), 1000*median(got[formRead]), 1000*median(got[formFenced]), ratio)
		}
	}
	res.Unfenced, res.Read, res.Fenced = summarize(all[formUnfenced]), summarize(all[formRead]), summarize(all[formFenced])
	res.MedianRatio = res.Fenced.P50 / res.Unfenced.P50
	res.MeanRatio = res.Fenced.Mean / res.Unfenced.Mean
	res.ReadRatio = res.Fenced.P50 / res.Read.P50
	return res, nil
}

// txQueries are the statements of the three forms.
type txQueries struct {
	insert, read, lease string
}

// txForms returns the three forms of the transaction: through database/sql
// on db, the member's pool (the unfenced and read forms on plain, which is
// db but on MariaDB with +begin), or on a pgxpool of their own fenced
// through clusterpgx.
func txForms(ctx context.Context, tg target, c *cluster.Cluster, db, plain *sql.DB, q txQueries) (ops [forms]func() error, closeApp func(), err error) {
	if tg.pgx {
		pool, err := pgxpool.New(ctx, tg.dsn)
		if err != nil {
			return ops, nil, err
		}
		for form := range forms {
			ops[form] = func() error {
				var (
					tx    pgx.Tx
					token uint64
					err   error
				)
				if form == formFenced && tg.beginFenced {
					tx, token, err = clusterpgx.BeginFenced(ctx, c, pool, pgx.TxOptions{})
					if err != nil {
						return err
					}
				} else if tx, err = pool.Begin(ctx); err != nil {
					return err
				}
				defer tx.Rollback(ctx)
				switch {
				case form == formRead:
					err = tx.QueryRow(ctx, q.read, q.lease).Scan(&token)
				case form == formFenced && !tg.beginFenced:
					token, err = c.Fence(ctx, clusterpgx.Tx(tx))
				}
				if err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, q.insert, int64(token), "payload"); err != nil {
					return err
				}
				return tx.Commit(ctx)
			}
		}
		return ops, pool.Close, nil
	}
	for form := range forms {
		ops[form] = func() error {
			var (
				tx    *sql.Tx
				token uint64
				err   error
			)
			switch {
			case form == formFenced && tg.beginFenced:
				// On clusterpgx.OpenDB's pool the BEGIN and the fence in
				// one batch.
				tx, token, err = c.BeginFenced(ctx, db, nil)
			case form == formFenced:
				tx, err = db.BeginTx(ctx, nil)
			default:
				tx, err = plain.BeginTx(ctx, nil)
			}
			if err != nil {
				return err
			}
			defer tx.Rollback()
			switch {
			case form == formRead:
				err = tx.QueryRowContext(ctx, q.read, q.lease).Scan(&token)
			case form == formFenced && !tg.beginFenced:
				token, err = c.Fence(ctx, tx)
			}
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, q.insert, int64(token), "payload"); err != nil {
				return err
			}
			return tx.Commit()
		}
	}
	return ops, func() {}, nil
}
