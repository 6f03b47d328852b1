package main

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pgBouncer is a PgBouncer of this run's own, in transaction mode, on a
// free loopback port in front of the PostgreSQL of the DSN, with its
// config and log in a temporary directory. stop ends it (by the process
// id it was started with) and removes the directory.
type pgBouncer struct {
	cmd  *exec.Cmd
	dir  string
	port int
}

// startPgBouncer starts PgBouncer for up to maxClients client connections
// sharing poolSize server connections.
func startPgBouncer(pgDSN string, maxClients, poolSize int) (*pgBouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer is not installed: %w", err)
	}
	u, err := url.Parse(pgDSN)
	if err != nil {
		return nil, err
	}
	host, port := u.Hostname(), cmpOr(u.Port(), "5432")
	db := strings.TrimPrefix(u.Path, "/")
	userName := cmpOr(u.User.Username(), "postgres")
	dir, err := os.MkdirTemp("", "bench-pgbouncer-")
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	listen := l.Addr().(*net.TCPAddr).Port
	l.Close()

	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%s dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
pool_mode = transaction
auth_type = trust
auth_file = %s
max_client_conn = %d
default_pool_size = %d
max_db_connections = %d
logfile = %s
`, db, host, port, db, listen, filepath.Join(dir, "userlist.txt"), maxClients, poolSize, poolSize, filepath.Join(dir, "pgbouncer.log"))
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(strconv.Quote(userName)+` ""`+"\n"), 0o644); err != nil {
		return nil, err
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root; it switches to -u.
		pg, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgbouncer refuses root and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(pg.Uid)
		gid, _ := strconv.Atoi(pg.Gid)
		for _, f := range []string{dir, filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "userlist.txt")} {
			if err := os.Chown(f, uid, gid); err != nil {
				return nil, err
			}
		}
		args = append([]string{"-u", "postgres"}, args...)
	}
	b := &pgBouncer{cmd: exec.Command(bin, args...), dir: dir, port: listen}
	var stderr bytes.Buffer
	b.cmd.Stderr = &stderr
	if err := b.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", listen)); err == nil {
			c.Close()
			return b, nil
		}
		if time.Now().After(deadline) || b.cmd.ProcessState != nil {
			logText, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			b.stop()
			return nil, fmt.Errorf("pgbouncer did not listen within 10s: %s %s", stderr.String(), logText)
		}
	}
}

// dsn is pgDSN pointed at the bouncer, with pgx's exec mode that works
// behind a transaction pooler (no named prepared statements kept across
// transactions; see "PgBouncer" in docs/operating.md).
func (b *pgBouncer) dsn(pgDSN string) (string, error) {
	u, err := url.Parse(pgDSN)
	if err != nil {
		return "", err
	}
	u.Host = fmt.Sprintf("127.0.0.1:%d", b.port)
	q := u.Query()
	q.Set("default_query_exec_mode", "exec")
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// logTail returns the last lines of the bouncer's log.
func (b *pgBouncer) logTail(n int) string {
	text, err := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(text)), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

func (b *pgBouncer) stop() {
	if b.cmd.Process != nil && b.cmd.ProcessState == nil {
		b.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { b.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			b.cmd.Process.Kill()
			<-done
		}
	}
	os.RemoveAll(b.dir)
}
