package cluster

import (
	"context"
	"testing"
	"time"
)

// A fence's time limit is the lease's TTL, or nine tenths of what the
// context has left rounded down to a power of two milliseconds, so that
// the reads of all deadlines share few texts (each prepared once).
func TestFenceLimit(t *testing.T) {
	ttl := 5 * time.Second
	for _, tc := range []struct {
		left time.Duration // 0: no deadline
		want time.Duration
	}{
		{0, ttl},
		{time.Hour, ttl},
		{6 * time.Second, ttl}, // nine tenths of it is more than the TTL
		{time.Second, 512 * time.Millisecond},
		{4 * time.Second, 2048 * time.Millisecond},
		{100 * time.Millisecond, 64 * time.Millisecond},
		{time.Millisecond, time.Millisecond},
		{-time.Second, time.Millisecond}, // past its deadline
	} {
		ctx := context.Background()
		if tc.left != 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, tc.left)
			defer cancel()
		}
		got := fenceLimit(ctx, ttl)
		// The time between WithTimeout and fenceLimit may take a
		// millisecond off a limit at a power of two's edge; none of the
		// cases is near one.
		if got != tc.want {
			t.Errorf("fenceLimit with %v left, TTL %v = %v; want %v", tc.left, ttl, got, tc.want)
		}
	}
}
