package cluster_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// Config.Events gets every event from the first; a channel given to
// Notify later gets those emitted after; nil and repeated channels are
// ignored; the last event is in the channels when Shutdown returns.
func TestNotify(t *testing.T) {
	t.Parallel()
	first, later := make(chan cluster.Event, 16), make(chan cluster.Event, 16)
	cfg := fakeConfig(t, "a", &fakeProvider{})
	cfg.Events = first
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.Notify(later)
	c.Notify(later)
	c.Notify(first)
	c.Notify(nil)
	if err := c.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	kinds := func(ch chan cluster.Event) []cluster.EventKind {
		var got []cluster.EventKind
		for len(ch) > 0 {
			got = append(got, (<-ch).Kind)
		}
		return got
	}
	if got, want := kinds(first), []cluster.EventKind{cluster.EventLeaseAcquired, cluster.EventLeaderChanged, cluster.EventLeaseReleased}; !slices.Equal(got, want) {
		t.Errorf("Config.Events got %v, want %v", got, want)
	}
	if got, want := kinds(later), []cluster.EventKind{cluster.EventLeaseReleased}; !slices.Equal(got, want) {
		t.Errorf("a channel given to Notify after New got %v, want %v", got, want)
	}
	if d := c.Stats().EventsDropped; d != 0 {
		t.Errorf("EventsDropped = %d with room in every channel", d)
	}
}

// A channel nobody receives from never delays the heartbeat or Shutdown:
// the events that find it full are dropped and counted.
func TestFullChannelDoesNotBlock(t *testing.T) {
	t.Parallel()
	p := &fakeProvider{}
	cfg := fakeConfig(t, "a", p)
	cfg.Events = make(chan cluster.Event) // unbuffered, never received from
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A sleep, as nothing is to happen: longer than a lease, which stopped
	// renewals would not keep.
	time.Sleep(3 * testdb.LeaseTTL / 2)
	if !c.IsLeader() {
		t.Fatal("a full channel stopped the renewals")
	}
	if err := shutdownWithin(t, c); err != nil {
		t.Fatal(err)
	}
	if d := c.Stats().EventsDropped; d != 3 {
		t.Fatalf("EventsDropped = %d, want 3 (acquired, leader-changed, released)", d)
	}
}

// Shutdown never waits for the receivers of events: with the receiver
// stuck in its handling of lease-acquired, Shutdown returns, and the final
// lease-released is in the channel for it. A Shutdown called while
// another is under way waits for it.
func TestShutdownDoesNotWaitForReceivers(t *testing.T) {
	t.Parallel()
	book := newLeaseBook()
	entered := make(chan struct{})
	proceed := make(chan struct{})
	a := startBook(t, book, shutdownOnKind("none"), withHandler(t, func(e cluster.Event) {
		if e.Kind == cluster.EventLeaseAcquired {
			close(entered)
			<-proceed
		}
	}))
	<-entered
	results := make(chan error, 2)
	for range 2 {
		go func() { results <- shutdownWithin(t, a.Cluster) }()
	}
	for range 2 {
		if err := <-results; err != nil {
			t.Fatalf("Shutdown = %v", err)
		}
	}
	if book.held() {
		t.Fatal("lease still held")
	}
	close(proceed)
	waitFor(t, shutdownBound, "the receiver to get lease-released", func() bool {
		evs := a.events.all()
		return len(evs) > 0 && evs[len(evs)-1].Kind == cluster.EventLeaseReleased
	})
}
