package cluster

import (
	"sync/atomic"
	"testing"
	"time"
)

// A grant quiets the delayed wake-ups that a second copy of its release
// would arm, except for a release by the node that was just granted the
// lease, which is a new one (it gave the term back at once) and must wake
// the others.
func TestDesignationQuietAfterGrant(t *testing.T) {
	var woken atomic.Int32
	d := designated("me", func(bool) { woken.Add(1) })
	defer d.stop()
	wait := func() { time.Sleep(2*successorLead + 50*time.Millisecond) }

	d.hear("other") // a release naming another successor: a delayed wake
	d.taken("other")
	d.hear("other") // the same release heard again, late (LISTEN)
	wait()
	if n := woken.Load(); n != 0 {
		t.Fatalf("woken %d times after the lease was granted; want the delayed wake cancelled and the late copy ignored", n)
	}

	d.taken("other")
	d.releasedBy("other") // the new holder gave the term back at once
	d.hear("third")
	wait()
	if n := woken.Load(); n != 1 {
		t.Fatalf("woken %d times after the new holder released at once; want one delayed wake", n)
	}
}
