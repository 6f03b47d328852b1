package cluster_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The multi-process tests run this binary again as cluster nodes.
	if os.Getenv(envChild) != "" {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m,
		// database/sql opens connections on a goroutine per pool; the pools
		// are closed by t.Cleanup but the opener may be mid-exit.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}
