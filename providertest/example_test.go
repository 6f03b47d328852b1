package providertest_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/providertest"
)

// A test of leader-only code with no database: two nodes share a Memory,
// the leader crashes, its lease runs out, and the other node takes over.
// The test waits on channels, never on a sleep, and the Clock stands
// still, so no lease expires unless the test says so.
func Example() {
	ctx := context.Background()
	clock := providertest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	store := providertest.NewMemory(clock.Now)

	started := make(chan string, 4) // the leader-only job reports here
	stopped := make(chan string, 4)
	var jobs sync.WaitGroup
	defer jobs.Wait() // after the Shutdowns below, which end RunWhileLeader
	start := func(id string) *cluster.Cluster {
		c, err := cluster.New(ctx, cluster.Config{
			NodeID:            id,
			Provider:          store,
			LeaseTTL:          time.Second,
			HeartbeatInterval: 100 * time.Millisecond,
			FenceTimeout:      700 * time.Millisecond,
		})
		if err != nil {
			log.Fatal(err)
		}
		// The leader-only code under test: a job that runs while its node
		// leads.
		jobs.Go(func() {
			c.RunWhileLeader(ctx, func(ctx context.Context, token uint64) error {
				started <- fmt.Sprintf("%s runs the job in term %d", id, token)
				<-ctx.Done()
				stopped <- fmt.Sprintf("%s stopped the job", id)
				return nil
			})
		})
		return c
	}
	a := start("a") // the first node leads when New returns
	defer a.Shutdown(ctx)
	b := start("b")
	defer b.Shutdown(ctx)
	fmt.Println(<-started)

	// Node a crashes: it can no longer reach the store, and its lease runs
	// out at once instead of after LeaseTTL (clock.Advance(time.Second)
	// would do the same).
	store.Disconnect("a")
	store.Expire("leader")
	fmt.Println(<-started) // b takes over at its next attempt
	fmt.Println(<-stopped) // a stops when its trust window (FenceTimeout) ends
	// Output:
	// a runs the job in term 1
	// b runs the job in term 2
	// a stopped the job
}
