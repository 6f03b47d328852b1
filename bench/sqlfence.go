package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" driver
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
)

// A target is one database this package runs on, reached through
// database/sql or, for "pgx", through clusterpgx over a pgxpool.
type target struct {
	name    string // sqlite, postgres, mariadb, pgx
	dialect cluster.Dialect
	driver  string // the database/sql driver (for pgx: of the admin handle)
	dsn     string
	pgx     bool   // members hold the lease through clusterpgx
	prefix  string // table prefix, unique to the run
	// ping is when pgx (pgxpool and stdlib alike) sends its liveness ping
	// before reusing a PostgreSQL connection idle for over a second, a
	// round trip and a server transaction: "app" (the default) before the
	// application's statements only, as on a pool of clusterpgx.OpenDB or
	// a pgxpool with clusterpgx.ShouldPing; "pgx" before every statement,
	// the provider's too (stdlib.OpenDB, pgxpool's default); "none" never.
	ping string
	// beginFenced fences the application's transactions with
	// clusterpgx.BeginFenced (pgx) or Cluster.BeginFenced
	// (database/sql, on a pool of clusterpgx.OpenDB): the BEGIN and the
	// fence in one round trip, rather than a BEGIN and then Fence.
	beginFenced bool
	// ownPool runs the application's database/sql transactions of the
	// fenced-transaction comparison on a pool of their own, not on the
	// member's (Config.DB): Fence then sends its read's text, as it does in
	// a transaction of another *sql.DB ("/own-pool" after the name).
	ownPool bool
}

// dsns are the databases of the run, from the flags.
type dsns struct {
	postgres, mysql, sqliteDir string
}

func newPrefix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return "bx" + hex.EncodeToString(b) + "_"
}

func newTarget(name string, d dsns, prefix string) (target, error) {
	if base, ok := strings.CutSuffix(name, "/own-pool"); ok {
		tg, err := newTarget(base, d, prefix)
		if tg.pgx || tg.beginFenced {
			return target{}, fmt.Errorf("system %q: /own-pool is for database/sql without +begin (pgx's transactions run on a pool of their own already; +begin needs the member's pool of clusterpgx.OpenDB)", name)
		}
		tg.name, tg.ownPool = name, true
		return tg, err
	}
	switch name {
	case "sqlite":
		path := filepath.Join(d.sqliteDir, "bench.db")
		return target{name: name, dialect: cluster.SQLite, driver: "sqlite", prefix: prefix,
			dsn: "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"}, nil
	case "postgres":
		return target{name: name, dialect: cluster.Postgres, driver: "pgx", dsn: d.postgres, prefix: prefix}, nil
	case "postgres+begin":
		return target{name: name, dialect: cluster.Postgres, driver: "pgx", dsn: d.postgres, prefix: prefix, beginFenced: true}, nil
	case "pgx":
		return target{name: name, dialect: cluster.Postgres, driver: "pgx", dsn: d.postgres, pgx: true, prefix: prefix}, nil
	case "pgx+begin":
		return target{name: name, dialect: cluster.Postgres, driver: "pgx", dsn: d.postgres, pgx: true, prefix: prefix, beginFenced: true}, nil
	case "mariadb", "mysql":
		return target{name: "mariadb", dialect: cluster.MySQL, driver: "mysql", dsn: d.mysql, prefix: prefix}, nil
	case "mariadb+ip":
		// go-sql-driver/mysql prepares, runs and closes a statement that
		// has arguments (two round trips) unless interpolateParams is set,
		// which sends it as one query with the arguments escaped.
		sep := "?"
		if strings.Contains(d.mysql, "?") {
			sep = "&"
		}
		return target{name: name, dialect: cluster.MySQL, driver: "mysql", dsn: d.mysql + sep + "interpolateParams=true", prefix: prefix}, nil
	}
	return target{}, fmt.Errorf("unknown system %q", name)
}

// memberDB is what one member holds the lease through: its own pool.
type memberDB struct {
	db    *sql.DB       // database/sql members
	pool  *pgxpool.Pool // clusterpgx members
	close func() error
}

// openMember opens a pool of at most conns connections for one member.
func (tg target) openMember(ctx context.Context, conns int) (memberDB, error) {
	if tg.pgx {
		cfg, err := pgxpool.ParseConfig(tg.dsn)
		if err != nil {
			return memberDB{}, err
		}
		cfg.MaxConns = int32(conns)
		cfg.MinConns = 0
		switch tg.ping {
		case "none":
			cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		case "app", "":
			cfg.ShouldPing = clusterpgx.ShouldPing
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return memberDB{}, err
		}
		return memberDB{pool: pool, close: func() error { pool.Close(); return nil }}, nil
	}
	var db *sql.DB
	if tg.dialect == cluster.Postgres {
		cc, err := pgx.ParseConfig(tg.dsn)
		if err != nil {
			return memberDB{}, err
		}
		var opts []stdlib.OptionOpenDB
		open := clusterpgx.OpenDB // its transactions can begin fenced; see ping
		switch {
		case tg.ping == "none":
			opts = append(opts, stdlib.OptionShouldPing(func(context.Context, stdlib.ShouldPingParams) bool { return false }))
		case tg.ping == "pgx" && tg.beginFenced:
			opts = append(opts, stdlib.OptionShouldPing(func(_ context.Context, p stdlib.ShouldPingParams) bool { return p.IdleDuration > time.Second }))
		case tg.ping == "pgx":
			open = stdlib.OpenDB
		}
		db = open(*cc, opts...)
	} else {
		var err error
		if db, err = sql.Open(tg.driver, tg.dsn); err != nil {
			return memberDB{}, err
		}
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return memberDB{db: db, close: db.Close}, nil
}

// config returns member id's Config on m.
func (tg target) config(m memberDB, id string) (cluster.Config, error) {
	cfg := cluster.Config{NodeID: id, TablePrefix: tg.prefix}
	if m.pool != nil {
		p, err := clusterpgx.NewProviderWithPrefix(m.pool, tg.prefix)
		if err != nil {
			return cfg, err
		}
		cfg.Provider = p
	} else {
		cfg.DB = m.db
	}
	return cfg, nil
}

// openAdmin opens the handle the benchmark itself uses: to read the lease
// row, to write the fenced rows, and to drop the run's tables.
func (tg target) openAdmin() (*sql.DB, error) {
	db, err := sql.Open(tg.driver, tg.dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(4)
	return db, nil
}

// dropTables removes every table (and, on PostgreSQL, guard function)
// whose name begins with the run's prefix.
func (tg target) dropTables(ctx context.Context, db *sql.DB) error {
	if tg.dialect == cluster.SQLite {
		return nil // the file lives in a temporary directory
	}
	list := "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_name LIKE $1"
	if tg.dialect == cluster.MySQL {
		list = "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?"
	}
	names, err := queryStrings(ctx, db, list, tg.prefix+"%")
	if err != nil {
		return err
	}
	for _, n := range names {
		if strings.HasPrefix(n, tg.prefix) {
			if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+n); err != nil {
				return err
			}
		}
	}
	if tg.dialect == cluster.Postgres {
		funcs, err := queryStrings(ctx, db, "SELECT oid::regprocedure::text FROM pg_proc WHERE pronamespace = current_schema()::regnamespace AND proname LIKE $1", tg.prefix+"%")
		if err != nil {
			return err
		}
		for _, f := range funcs {
			if _, err := db.ExecContext(ctx, "DROP FUNCTION IF EXISTS "+f); err != nil {
				return err
			}
		}
	}
	return nil
}

func queryStrings(ctx context.Context, db *sql.DB, q string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// timings are the election timings every system of a run shares.
type timings struct {
	ttl, heartbeat time.Duration
}

// releaseMode is how a member of this package releases its lease in a
// handoff trial.
type releaseMode string

const (
	releaseShutdown releaseMode = "shutdown" // Cluster.Shutdown: the node leaves
	releaseResign   releaseMode = "resign"   // Cluster.Resign: the node stays a candidate
)

// sqlfenceSystem runs members of this package on one target.
type sqlfenceSystem struct {
	tg        target
	label     string
	lease     string
	n, conns  int
	tm        timings
	mode      releaseMode
	log       *slog.Logger
	observer  func(cluster.Operation)
	configure func(*cluster.Config) error // -pg-handoff; nil for none
	admin     *sql.DB
	acq       chan acquisition

	mu      sync.Mutex
	members []*sqlMember
	gen     int
}

type sqlMember struct {
	c      *cluster.Cluster
	db     memberDB
	events chan cluster.Event // Config.Events, closed after Shutdown
}

// shutdown shuts the member down and ends the goroutine receiving its
// events (the Cluster sends nothing once Shutdown has returned).
func (m *sqlMember) shutdown(ctx context.Context) error {
	err := m.c.Shutdown(ctx)
	close(m.events)
	return err
}

// eventsTo returns a channel for Config.Events whose events f receives, in
// order, on a goroutine that ends when the channel is closed.
func eventsTo(f func(cluster.Event)) chan cluster.Event {
	ch := make(chan cluster.Event, 256)
	go func() {
		for e := range ch {
			f(e)
		}
	}()
	return ch
}

type sqlfenceOptions struct {
	label     string // the system's name in results; the target's by default
	lease     string
	members   int
	conns     int // connections per member's pool
	tm        timings
	mode      releaseMode
	log       *slog.Logger
	observer  func(cluster.Operation)
	configure func(*cluster.Config) error
}

func newSQLFence(tg target, o sqlfenceOptions) (*sqlfenceSystem, error) {
	admin, err := tg.openAdmin()
	if err != nil {
		return nil, err
	}
	return &sqlfenceSystem{
		tg: tg, label: cmpOr(o.label, tg.name), lease: o.lease, n: o.members, conns: o.conns, tm: o.tm,
		mode: o.mode, log: o.log, observer: o.observer, configure: o.configure, admin: admin,
		acq:     make(chan acquisition, 4096),
		members: make([]*sqlMember, o.members),
	}, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (s *sqlfenceSystem) name() string { return s.label }
func (s *sqlfenceSystem) size() int    { return s.n }

func (s *sqlfenceSystem) acquisitions() <-chan acquisition { return s.acq }

func (s *sqlfenceSystem) start(ctx context.Context, slot int) error {
	s.mu.Lock()
	s.gen++
	id := fmt.Sprintf("%s-%d-g%d", s.tg.name, slot, s.gen)
	s.mu.Unlock()
	db, err := s.tg.openMember(ctx, s.conns)
	if err != nil {
		return err
	}
	cfg, err := s.tg.config(db, id)
	if err != nil {
		db.close()
		return err
	}
	cfg.LeaseName = s.lease
	cfg.LeaseTTL, cfg.HeartbeatInterval = s.tm.ttl, s.tm.heartbeat
	cfg.Logger = s.log
	cfg.Observer = s.observer
	events := eventsTo(func(e cluster.Event) {
		if e.Kind == cluster.EventLeaseAcquired {
			report(s.acq, slot, e.At) // At is taken as the term is stored
			traceAt(e.At, id, "acquired event x")
		}
	})
	cfg.Events = events
	if observe := cfg.Observer; tracing {
		cfg.Observer = func(o cluster.Operation) {
			if observe != nil {
				observe(o)
			}
			traceOp(id, o)
		}
	}
	if s.configure != nil {
		if err := s.configure(&cfg); err != nil {
			db.close()
			return err
		}
	}
	c, err := cluster.New(ctx, cfg)
	if err != nil {
		close(events)
		db.close()
		return err
	}
	s.mu.Lock()
	s.members[slot] = &sqlMember{c: c, db: db, events: events}
	s.mu.Unlock()
	return nil
}

func (s *sqlfenceSystem) member(slot int) *sqlMember {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.members[slot]
}

func (s *sqlfenceSystem) take(slot int) *sqlMember {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.members[slot]
	s.members[slot] = nil
	return m
}

func (s *sqlfenceSystem) leads(slot int) bool {
	m := s.member(slot)
	return m != nil && m.c.IsLeader()
}

// cluster returns the member in slot, for the fenced-write benchmark.
func (s *sqlfenceSystem) cluster(slot int) *cluster.Cluster {
	if m := s.member(slot); m != nil {
		return m.c
	}
	return nil
}

func (s *sqlfenceSystem) release(ctx context.Context, slot int) (bool, error) {
	if s.mode == releaseResign {
		m := s.member(slot)
		if m == nil {
			return false, errEmptySlot
		}
		who := s.label + "-" + strconv.Itoa(slot)
		traceAt(time.Now(), who, "resign call start")
		err := m.c.Resign(ctx)
		traceAt(time.Now(), who, "resign call end")
		return false, err
	}
	m := s.take(slot)
	if m == nil {
		return true, errEmptySlot
	}
	who := s.label + "-" + strconv.Itoa(slot)
	traceAt(time.Now(), who, "shutdown call start")
	err := m.shutdown(ctx)
	traceAt(time.Now(), who, "shutdown call end")
	m.db.close()
	traceAt(time.Now(), who, "pool closed end")
	return true, err
}

// crash closes the member's pool under it: its heartbeat fails from then
// on and it never releases. The pool's Close waits for a statement in
// flight, so no renew lands after it returns. The member itself is shut
// down later, off the clock, so its goroutines end.
func (s *sqlfenceSystem) crash(ctx context.Context, slot int) error {
	m := s.take(slot)
	if m == nil {
		return errEmptySlot
	}
	if err := m.db.close(); err != nil {
		return err
	}
	go func() {
		// Its trust window ends by itself; Shutdown's release then fails
		// on the closed pool, as a dead process's would never run.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		m.shutdown(sctx)
	}()
	return nil
}

func (s *sqlfenceSystem) stop(ctx context.Context, slot int) {
	if m := s.take(slot); m != nil {
		m.shutdown(ctx)
		m.db.close()
	}
}

func (s *sqlfenceSystem) close(ctx context.Context) error {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for slot := range s.n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s.stop(ctx, slot)
		}()
	}
	wg.Wait()
	return s.admin.Close()
}

// leaseRow reads the lease row through the benchmark's own handle.
func (s *sqlfenceSystem) leaseRow(ctx context.Context) (leaseRow, error) {
	q := "SELECT fencing_token, acquired_at, expires_at FROM " + s.tg.prefix + "lease WHERE name = "
	if s.tg.dialect == cluster.Postgres {
		q += "$1"
	} else {
		q += "?"
	}
	var r leaseRow
	err := s.admin.QueryRowContext(ctx, q, s.lease).Scan(&r.Token, &r.AcquiredAt, &r.ExpiresAt)
	return r, err
}

var _ leaseRows = (*sqlfenceSystem)(nil)
