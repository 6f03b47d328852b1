package cluster_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// database/sql opens connections on a goroutine per pool; the pools
		// are closed by t.Cleanup but the opener may be mid-exit.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}
