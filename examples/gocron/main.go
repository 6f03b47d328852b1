// Command gocron runs a gocron scheduler whose jobs run only on the node
// that leads: gocron asks its elector before each run, and a one-method
// adapter over cluster.RequireLeader answers. Run two against one database
// file and stop the one that prints:
//
//	go run . -node node-1 -db /tmp/gocron.db &
//	go run . -node node-2 -db /tmp/gocron.db &
//
// It lives in a module of its own, so the core module does not depend on
// gocron.
package main

import (
	"context"
	"database/sql"
	"flag"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/go-co-op/gocron/v2"
	_ "modernc.org/sqlite"

	"github.com/sqlfence/cluster"
)

// elector lets gocron run a job only on the leader: gocron skips the run
// when IsLeader returns an error.
type elector struct{}

func (elector) IsLeader(context.Context) error { return cluster.RequireLeader() }

var _ gocron.Elector = elector{}

func main() {
	node := flag.String("node", "node-1", "this node's ID")
	path := flag.String("db", filepath.Join(os.TempDir(), "gocron-example.db"), "SQLite database file shared by the nodes")
	every := flag.Duration("every", time.Second, "how often the job runs")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *node, *path, *every, func(token uint64) {
		log.Printf("%s: hourly report (fencing token %d)", *node, token)
	}); err != nil {
		log.Fatal(err)
	}
}

// run joins the cluster and runs job every interval on the leader until
// ctx is done.
func run(ctx context.Context, node, path string, every time.Duration, job func(token uint64)) error {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		return err
	}
	defer db.Close()
	if err := cluster.Init(ctx, cluster.Config{NodeID: node, DB: db, LeaseTTL: 3 * time.Second}); err != nil {
		return err
	}
	defer cluster.Shutdown(context.Background())

	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector{}))
	if err != nil {
		return err
	}
	if _, err := s.NewJob(gocron.DurationJob(every), gocron.NewTask(func() {
		// The job writes through cluster.Fence in real life; here it
		// reports the term it ran in.
		job(cluster.FencingToken())
	})); err != nil {
		return err
	}
	s.Start()
	<-ctx.Done()
	return s.Shutdown()
}
