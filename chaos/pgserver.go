package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The PostgreSQL servers of the failover experiment: a primary and its
// standby, each a cluster of its own made by the distribution's initdb in
// the experiment's directory, on a port of its own, and removed with the
// directory at the end. Nothing here touches the machine's own clusters.

// pgBinaries are the programs the failover experiment runs.
var pgBinaries = []string{"initdb", "postgres", "pg_ctl", "pg_basebackup"}

// findPGBin returns the directory holding the PostgreSQL server programs:
// dir when given, otherwise the newest /usr/lib/postgresql/<version>/bin
// (Debian's layout), otherwise the directory pg_config names.
func findPGBin(dir string) (string, error) {
	var candidates []string
	if dir != "" {
		candidates = []string{dir}
	} else {
		vs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		slices.SortFunc(vs, func(a, b string) int { return pgVersion(b) - pgVersion(a) })
		candidates = vs
		if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
			candidates = append(candidates, strings.TrimSpace(string(out)))
		}
	}
	for _, d := range candidates {
		ok := true
		for _, b := range pgBinaries {
			if fi, err := os.Stat(filepath.Join(d, b)); err != nil || fi.IsDir() {
				ok = false
				break
			}
		}
		if ok {
			return d, nil
		}
	}
	return "", fmt.Errorf("no directory with %s found (tried %v; set -pg-bin)", strings.Join(pgBinaries, ", "), candidates)
}

func pgVersion(bin string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
	return v
}

// pgUser is the account the servers run as: the current one, or the
// postgres account when running as root (the server refuses root).
type pgUser struct {
	cred *syscall.Credential // nil: run as the current user
	uid  int
	gid  int
}

func serverUser() (pgUser, error) {
	if os.Geteuid() != 0 {
		return pgUser{uid: os.Geteuid(), gid: os.Getegid()}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return pgUser{}, fmt.Errorf("running as root, and there is no postgres account to run the servers as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return pgUser{cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid: uid, gid: gid}, nil
}

// A pgServer is one PostgreSQL cluster: its data directory, port and
// postmaster process.
type pgServer struct {
	name string // primary, standby
	bin  string
	as   pgUser
	data string
	log  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

func newPGServer(name, bin string, as pgUser, dir string) (*pgServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	return &pgServer{name: name, bin: bin, as: as, data: filepath.Join(dir, name), log: filepath.Join(dir, name+".log"), port: port}, nil
}

// freePort returns a TCP port on the loopback interface that was free a
// moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *pgServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// dsn is the DSN of the server's postgres database; application_name
// names the connection's sessions (empty: the driver's default).
func (s *pgServer) dsn(app string) string {
	d := "postgres://postgres@" + s.addr() + "/postgres?sslmode=disable&connect_timeout=5"
	if app != "" {
		d += "&application_name=" + app
	}
	return d
}

// run runs one of the PostgreSQL programs as the server's user, with its
// output in the error when it fails.
func (s *pgServer) run(ctx context.Context, prog string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, prog), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.as.cred, Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGCONNECT_TIMEOUT=5")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", prog, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// initPrimary creates the primary's cluster: trust authentication on
// loopback (initdb's -A trust covers replication connections too) and WAL
// fit for a streaming standby. fsync is off: the primary's files are
// thrown away after its crash, which is what the experiment is about.
func (s *pgServer) initPrimary(ctx context.Context) error {
	if err := s.run(ctx, "initdb", "-D", s.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		return err
	}
	return s.configure(
		"wal_level = replica",
		"max_wal_senders = 4",
		"fsync = off",
		"synchronous_commit = on", // local durability only: the standby is asynchronous
	)
}

// configure appends settings to postgresql.conf, after the ones copied
// from elsewhere, so that they win; the port and the listening address
// always.
func (s *pgServer) configure(settings ...string) error {
	f, err := os.OpenFile(filepath.Join(s.data, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	common := []string{
		"# added by the chaos harness",
		"port = " + strconv.Itoa(s.port),
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = ''",
		"max_connections = 40",
		"shared_buffers = 16MB",
		"logging_collector = off",
	}
	_, err = f.WriteString(strings.Join(append(common, settings...), "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// baseBackup makes s a standby of the server at from (host:port), with
// pg_basebackup -R, which writes primary_conninfo for that address and
// standby.signal: s then streams from whatever listens there.
func (s *pgServer) baseBackup(ctx context.Context, from string) error {
	host, port, _ := net.SplitHostPort(from)
	if err := s.run(ctx, "pg_basebackup", "-h", host, "-p", port, "-U", "postgres", "-D", s.data, "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		return err
	}
	return s.configure("hot_standby = on", "wal_receiver_status_interval = 1s")
}

// start runs the postmaster as a child of the harness, which sends it
// SIGQUIT (an immediate shutdown) if the harness dies, and waits until it
// accepts connections.
func (s *pgServer) start(ctx context.Context) error {
	logf, err := os.OpenFile(s.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.data)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.as.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(s.done)
	}()
	db, err := sql.Open("pgx", s.dsn(""))
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = db.PingContext(pctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("%s exited at start: %s", s.name, s.tail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not accept connections within 60s: %v; %s", s.name, err, s.tail())
		}
	}
}

// tail is the end of the server's log, for error messages.
func (s *pgServer) tail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return strings.TrimSpace(string(b))
}

func (s *pgServer) running() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// crash ends the server as pg_ctl stop -m immediate does: SIGQUIT to the
// postmaster, which kills every backend at once, with no checkpoint; it
// waits for the postmaster to exit, and kills the process group after 10s.
func (s *pgServer) crash() {
	if !s.running() {
		return
	}
	s.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
}

// promote ends recovery on a standby (pg_ctl promote, which waits until
// the server accepts writes).
func (s *pgServer) promote(ctx context.Context) error {
	return s.run(ctx, "pg_ctl", "promote", "-w", "-t", "60", "-D", s.data)
}

// prepareDir makes dir, which will hold both data directories, owned by
// the servers' user.
func prepareDir(dir string, as pgUser) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chown(dir, as.uid, as.gid); err != nil {
		return fmt.Errorf("give %s to the servers' user: %w", dir, err)
	}
	return nil
}

// errNoPostgres wraps why the failover experiment cannot run here.
var errNoPostgres = errors.New("the PostgreSQL server programs are not available")
