package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlfence/cluster"
)

// With -procs, each member of this package runs in an OS process of its
// own: the bench re-executes itself with the member's configuration in
// $BENCH_MEMBER. Members then share no memory, so a release reaches the
// others only through the database (NOTIFY on PostgreSQL, or their next
// poll), as it does between the machines of a real deployment; a crash is
// a SIGKILL. System etcd/procs runs etcd's members the same way, each a
// client process of the embedded server in the bench's process, so that
// the two can be compared across processes alike.
//
// The child prints one line per fact on its standard output, each with its
// wall-clock time in nanoseconds (the parent and the children read the same
// host clock):
//
//	ready                  the member started (cluster.New returned)
//	acquired <unixnano>    it began a term (the lease-acquired event's time)
//	leads <0|1>            its IsLeader changed
//	released <error or ->  the release asked for on standard input returned
//
// and reads commands on its standard input: "release" (Shutdown or
// Resign, as -release says; after Shutdown the child exits). With
// $BENCH_TRACE set, a child also writes every provider call, as
// Config.Observer reports it, to its standard error ("trace <start or end
// unixnano> <member> <kind> <outcome> start|end"), to see where a
// handoff's milliseconds go.
const memberEnv = "BENCH_MEMBER"

// memberSpec is a child's configuration.
type memberSpec struct {
	Name      string        `json:"name"` // the target: sqlite, postgres, pgx, mariadb
	DSN       string        `json:"dsn"`
	Pgx       bool          `json:"pgx"`
	Dialect   string        `json:"dialect"`
	Driver    string        `json:"driver"`
	Prefix    string        `json:"prefix"`
	Lease     string        `json:"lease"`
	ID        string        `json:"id"`
	Conns     int           `json:"conns"`
	TTL       time.Duration `json:"ttl"`
	Heartbeat time.Duration `json:"heartbeat"`
	Mode      releaseMode   `json:"mode"`
	PgHandoff string        `json:"pgHandoff"` // applied to PostgreSQL members
	Verbose   bool          `json:"verbose"`
	// Etcd, when set, is the client URL of the parent's embedded etcd
	// server: the child is then a member of etcd's concurrency.Election
	// under the prefix Lease (system etcd/procs), not of this package.
	Etcd string `json:"etcd,omitempty"`
}

// runMember is the child's main.
func runMember(ctx context.Context, spec string) error {
	var m memberSpec
	if err := json.Unmarshal([]byte(spec), &m); err != nil {
		return fmt.Errorf("$%s: %w", memberEnv, err)
	}
	if m.Etcd != "" {
		return runEtcdMember(m)
	}
	tg := target{name: m.Name, dialect: cluster.Dialect(m.Dialect), driver: m.Driver, dsn: m.DSN, pgx: m.Pgx, prefix: m.Prefix}
	db, err := tg.openMember(ctx, m.Conns)
	if err != nil {
		return err
	}
	defer db.close()
	cfg, err := tg.config(db, m.ID)
	if err != nil {
		return err
	}
	if tg.dialect == cluster.Postgres {
		_, configure, err := pgHandoffMode(m.PgHandoff)
		if err != nil {
			return err
		}
		if err := configure(&cfg); err != nil {
			return err
		}
	}
	say := sayer()
	cfg.LeaseName = m.Lease
	cfg.LeaseTTL, cfg.HeartbeatInterval = m.TTL, m.Heartbeat
	cfg.Logger = quietLogger(m.Verbose)
	// The child exits after Shutdown, which ends the receiving goroutine.
	cfg.Events = eventsTo(func(e cluster.Event) {
		if e.Kind == cluster.EventLeaseAcquired {
			say("acquired %d", e.At.UnixNano())
			traceAt(e.At, m.ID, "acquired event x")
		}
	})
	if tracing {
		cfg.Observer = func(o cluster.Operation) { traceOp(m.ID, o) }
	}
	c, err := cluster.New(ctx, cfg)
	if err != nil {
		return err
	}
	say("ready")

	// IsLeader also turns false by itself when a trust window ends, with
	// no event: sample it.
	stopWatch := watchLeads(c.IsLeader, say)

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() != "release" {
			continue
		}
		if m.Mode == releaseResign {
			err := c.Resign(ctx)
			say("released %s", errText(err))
			continue
		}
		traceAt(time.Now(), m.ID, "shutdown call start")
		err := c.Shutdown(ctx)
		stopWatch()
		say("leads 0")
		say("released %s", errText(err))
		return nil
	}
	// Standard input closed: the parent is done with us.
	stopWatch()
	return c.Shutdown(ctx)
}

// runEtcdMember is the child's main for a member of etcd/procs: it
// campaigns as the in-process etcd members do and speaks the same
// protocol as a member of this package. A release resigns and leaves (the
// session is revoked), as the in-process members' release does, and the
// child exits.
func runEtcdMember(m memberSpec) error {
	say := sayer()
	srv := &etcdServer{endpoint: m.Etcd}
	mem, err := startEtcdMember(srv, m.Lease, m.ID, int(m.TTL/time.Second), func() {
		say("acquired %d", time.Now().UnixNano())
	})
	if err != nil {
		return err
	}
	say("ready")
	stopWatch := watchLeads(mem.isLeader, say)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() != "release" {
			continue
		}
		mem.leading.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := mem.el.Resign(ctx)
		cancel()
		mem.close()
		stopWatch()
		say("leads 0")
		say("released %s", errText(err))
		return nil
	}
	stopWatch()
	mem.close()
	return nil
}

// sayer returns a function that prints one line on standard output at a
// time.
func sayer() func(format string, args ...any) {
	var out sync.Mutex
	return func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
}

// watchLeads samples leads every millisecond and says "leads 0|1" when it
// changes (a lease check also turns false by itself, with no event), until
// the function it returns is called.
func watchLeads(leads func() bool, say func(format string, args ...any)) (stop func()) {
	done := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		was := false
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if now := leads(); now != was {
				was = now
				say("leads %d", map[bool]int{false: 0, true: 1}[now])
			}
		}
	})
	return func() { close(done); watch.Wait() }
}

func errText(err error) string {
	if err == nil {
		return "-"
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

// procSystem runs members as child processes: of this package
// (sqlfenceProcs) or of etcd's election (newEtcdProcs).
type procSystem struct {
	label   string
	spec    memberSpec
	acq     chan acquisition
	mu      sync.Mutex
	members []*procMember
	gen     int
}

type procMember struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	leads    atomic.Bool
	released chan string   // each "released" line
	exited   chan struct{} // closed once the process is waited for
}

func newProcSystem(label string, spec memberSpec, members int) *procSystem {
	return &procSystem{label: label, spec: spec, acq: make(chan acquisition, 4096), members: make([]*procMember, members)}
}

// sqlfenceProcs is a procSystem of this package's members. The lease row
// and the tables are read and dropped through base's handle.
type sqlfenceProcs struct {
	*procSystem
	base *sqlfenceSystem // its members stay empty
}

func newSQLFenceProcs(tg target, o sqlfenceOptions, pgHandoff string, verbose bool) (*sqlfenceProcs, error) {
	base, err := newSQLFence(tg, o)
	if err != nil {
		return nil, err
	}
	spec := memberSpec{
		Name: tg.name, DSN: tg.dsn, Pgx: tg.pgx, Dialect: string(tg.dialect), Driver: tg.driver, Prefix: tg.prefix,
		Lease: o.lease, Conns: o.conns, TTL: o.tm.ttl, Heartbeat: o.tm.heartbeat, Mode: o.mode,
		PgHandoff: pgHandoff, Verbose: verbose,
	}
	return &sqlfenceProcs{procSystem: newProcSystem(base.name()+"/procs", spec, o.members), base: base}, nil
}

func (s *sqlfenceProcs) leaseRow(ctx context.Context) (leaseRow, error) { return s.base.leaseRow(ctx) }

func (s *sqlfenceProcs) close(ctx context.Context) error {
	s.procSystem.close(ctx)
	return s.base.close(ctx)
}

var _ leaseRows = (*sqlfenceProcs)(nil)

// newEtcdProcs is etcd/procs: members of etcd's concurrency.Election under
// prefix, each an OS process of its own, against the embedded server of
// this process, so that across processes both sides are compared alike.
// Their release resigns and leaves, as the in-process members' does.
func newEtcdProcs(srv *etcdServer, prefix string, tm timings) *procSystem {
	return newProcSystem("etcd/procs", memberSpec{Name: "etcd", Etcd: srv.endpoint, Lease: prefix, TTL: tm.ttl, Mode: releaseShutdown}, slots)
}

func (s *procSystem) name() string                     { return s.label }
func (s *procSystem) size() int                        { return len(s.members) }
func (s *procSystem) acquisitions() <-chan acquisition { return s.acq }

func (s *procSystem) start(ctx context.Context, slot int) error {
	s.mu.Lock()
	s.gen++
	spec := s.spec
	spec.ID = fmt.Sprintf("%s-%d-g%d", spec.Name, slot, s.gen)
	s.mu.Unlock()
	js, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), memberEnv+"="+string(js))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	m := &procMember{cmd: cmd, stdin: stdin, released: make(chan string, 4), exited: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		defer close(m.exited)
		defer m.leads.Store(false)
		sc := bufio.NewScanner(stdout)
		readySent := false
		for sc.Scan() {
			word, arg, _ := strings.Cut(sc.Text(), " ")
			switch word {
			case "ready":
				if !readySent {
					readySent = true
					close(ready)
				}
			case "acquired":
				if ns, err := strconv.ParseInt(arg, 10, 64); err == nil {
					report(s.acq, slot, time.Unix(0, ns))
				}
			case "leads":
				m.leads.Store(arg == "1")
			case "released":
				m.released <- arg
			}
		}
		cmd.Wait()
		if !readySent {
			close(ready)
		}
	}()
	select {
	case <-ready:
	case <-ctx.Done():
		cmd.Process.Kill()
		<-m.exited
		return ctx.Err()
	}
	select {
	case <-m.exited:
		return fmt.Errorf("%s member %d exited before it was ready", s.name(), slot)
	default:
	}
	s.mu.Lock()
	s.members[slot] = m
	s.mu.Unlock()
	return nil
}

func (s *procSystem) member(slot int) *procMember {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.members[slot]
}

func (s *procSystem) take(slot int) *procMember {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.members[slot]
	s.members[slot] = nil
	return m
}

func (s *procSystem) leads(slot int) bool {
	m := s.member(slot)
	return m != nil && m.leads.Load()
}

func (s *procSystem) release(ctx context.Context, slot int) (bool, error) {
	m := s.member(slot)
	if m == nil {
		return true, errEmptySlot
	}
	if _, err := io.WriteString(m.stdin, "release\n"); err != nil {
		return false, err
	}
	var answer string
	select {
	case answer = <-m.released:
	case <-m.exited:
		return false, fmt.Errorf("%s member %d exited during its release", s.name(), slot)
	case <-ctx.Done():
		return false, ctx.Err()
	}
	var err error
	if answer != "-" {
		err = errors.New(answer)
	}
	if s.spec.Mode == releaseResign {
		return false, err
	}
	s.take(slot)
	m.stdin.Close()
	<-m.exited
	return true, err
}

// crash is a SIGKILL: the member never releases, and its connections
// close with the process.
func (s *procSystem) crash(ctx context.Context, slot int) error {
	m := s.take(slot)
	if m == nil {
		return errEmptySlot
	}
	m.leads.Store(false)
	if err := m.cmd.Process.Kill(); err != nil {
		return err
	}
	<-m.exited
	return nil
}

// stop ends the member with a clean Shutdown (standard input closed), or
// kills it if that takes too long.
func (s *procSystem) stop(ctx context.Context, slot int) {
	m := s.take(slot)
	if m == nil {
		return
	}
	m.stdin.Close()
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		m.cmd.Process.Kill()
		<-m.exited
	case <-ctx.Done():
		m.cmd.Process.Kill()
		<-m.exited
	}
}

func (s *procSystem) close(ctx context.Context) error {
	var wg sync.WaitGroup
	for slot := range s.members {
		wg.Go(func() { s.stop(ctx, slot) })
	}
	wg.Wait()
	return nil
}
