package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
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

// A release among many followers of one process wakes the successor it
// names at once and localFallbacks of the others a little later, not all
// of them: at a thousand members, all of them trying at once queued with
// the successor's grant. A release that names no successor (a pass) wakes
// localFallbacks+1 of them at once; one on a dialect that names none picks
// the successor among them. A follower that would not try is woken only
// when named (it then passes the turn on).
func TestReleaseWakesSuccessorAndFewFallbacks(t *testing.T) {
	const followers = 20
	defer func(d time.Duration) { successorLead = d }(successorLead)
	successorLead = 40 * time.Millisecond // "at once" and "later" stay apart on a busy machine
	p := &DBProvider{identity: "test-db", prefix: "wake_"}
	type wakeup struct {
		node  int
		named bool
		after time.Duration
	}
	wakes := make(chan wakeup, 10*followers)
	ctx, cancel := context.WithCancel(t.Context())
	var wg, registered sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var since atomic.Pointer[time.Time]
	for i := range followers {
		registered.Add(1)
		wg.Go(func() {
			p.watchNamed(ctx, "lease", fmt.Sprint(i), watchHooks{
				wake: func(named bool) {
					wakes <- wakeup{i, named, time.Since(*since.Load())}
				},
				// The second half would not try (holding off, stopping):
				// never woken unless named.
				ready:      func() bool { return i < followers/2 },
				live:       func(bool) {},
				registered: registered.Done,
			})
		})
	}
	registered.Wait()

	collect := func() []wakeup {
		time.Sleep(4*successorLead + 100*time.Millisecond)
		var got []wakeup
		for {
			select {
			case w := <-wakes:
				got = append(got, w)
			default:
				return got
			}
		}
	}
	release := func(holder, successor string, pick bool) []wakeup {
		now := time.Now()
		since.Store(&now)
		p.announce("lease", holder, successor, pick)
		return collect()
	}

	notReady := func(got []wakeup, named int) {
		t.Helper()
		for _, w := range got {
			if w.node >= followers/2 && w.node != named {
				t.Errorf("follower %d, which would not try, was woken: %v", w.node, got)
			}
		}
	}

	// Named successor 3 (holder 0 is not among the woken).
	got := release("0", "3", false)
	notReady(got, 3)
	if len(got) != 1+localFallbacks {
		t.Fatalf("a release naming a successor woke %d followers (%v); want the successor and %d others", len(got), got, localFallbacks)
	}
	for _, w := range got {
		switch {
		case w.node == 0:
			t.Errorf("the releasing node itself was woken: %v", got)
		case w.node == 3 && !w.named:
			t.Errorf("the successor was woken as not named: %v", got)
		case w.node != 3 && (w.named || w.after < successorLead):
			t.Errorf("follower %d woken after %v (named %v); want after at least %v, not named", w.node, w.after, w.named, successorLead)
		}
	}
	if !slices.ContainsFunc(got, func(w wakeup) bool { return w.node == 3 }) {
		t.Errorf("the named successor 3 was not woken: %v", got)
	}

	// A named successor that would not try is still told (it passes on).
	got = release("0", "13", false)
	notReady(got, 13)
	if !slices.ContainsFunc(got, func(w wakeup) bool { return w.node == 13 && w.named }) || len(got) != 1+localFallbacks {
		t.Errorf("a release naming follower 13, which would not try, woke %v; want 13 named and %d others", got, localFallbacks)
	}

	// A pass: no successor; localFallbacks+1 at once.
	got = release("3", "", false)
	notReady(got, -1)
	if len(got) != localFallbacks+1 {
		t.Fatalf("a pass woke %d followers (%v); want %d", len(got), got, localFallbacks+1)
	}
	for _, w := range got {
		if w.node == 3 || w.named || w.after >= successorLead {
			t.Errorf("a pass woke %v; want others than the passer, not named, at once", got)
		}
	}

	// A dialect that names no successor: one picked, at once and named.
	got = release("5", "", true)
	notReady(got, -1)
	if len(got) != 1+localFallbacks {
		t.Fatalf("a release with a picked successor woke %d followers (%v); want %d", len(got), got, 1+localFallbacks)
	}
	if named := slices.IndexFunc(got, func(w wakeup) bool { return w.named }); named < 0 || got[named].node == 5 {
		t.Errorf("want one picked successor, other than the holder, woken as named: %v", got)
	}
}

// listenFeed is a ListenPool whose notifications are fed by the test.
type listenFeed struct {
	Pool
	payloads chan string
}

func (f *listenFeed) Listen(ctx context.Context, _ string, ready func(), notify func(string)) error {
	ready()
	for {
		select {
		case <-ctx.Done():
			return nil
		case p := <-f.payloads:
			notify(p)
		}
	}
}

// A grant heard by LISTEN (the lease name, a tab and the new holder's
// instance) cancels the wake that its release armed for a follower that
// was not the successor, and is reported to the taken hook, unless it is
// this node's own grant or another lease's.
func TestListenerHearsGrants(t *testing.T) {
	defer func(d time.Duration) { successorLead = d }(successorLead)
	successorLead = 100 * time.Millisecond
	feed := &listenFeed{payloads: make(chan string)}
	p := &DBProvider{prefix: "wake_", d: &postgres{}, pool: feed}
	var woken atomic.Int32
	taken := make(chan string, 8)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() {
		p.watchNamed(ctx, "lease", "me", watchHooks{
			wake:   func(bool) { woken.Add(1) },
			taken:  func(holder string) { taken <- holder },
			live:   func(bool) {},
			listen: true,
		})
	})
	for _, payload := range []string{
		"lease\nother", // a release naming another successor: a wake in 100-200ms
		"lease",        // its companion, for older nodes
		"other\tnode",  // another lease's grant
		"lease\tme",    // a grant to this node (it would know already)
		"lease\tother", // the successor's grant
	} {
		feed.payloads <- payload
	}
	select {
	case h := <-taken:
		if h != "other" {
			t.Fatalf("taken(%q); want taken(\"other\") only", h)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the grant was not reported")
	}
	time.Sleep(3 * successorLead)
	if n := woken.Load(); n != 0 {
		t.Fatalf("woken %d times; want the release's delayed wake cancelled by the grant", n)
	}
	select {
	case h := <-taken:
		t.Fatalf("taken(%q) reported too", h)
	default:
	}

	feed.payloads <- "lease\nthird" // a later release, then no grant: the wake comes
	time.Sleep(3 * successorLead)
	if n := woken.Load(); n != 1 {
		t.Fatalf("woken %d times after a release with no grant; want 1", n)
	}
}

// A release that hands the term over sends its grant first, then the
// naming and the bare notification: a follower does not try (the
// successor holds the term), unless the successor never takes it up:
// then it tries once the handed term has expired (watchHooks.handedFor).
// The successor itself is told to read its term before it attempts.
func TestListenerHearsHandover(t *testing.T) {
	defer func(d time.Duration) { successorLead = d }(successorLead)
	successorLead = 50 * time.Millisecond
	feeds := map[string]*listenFeed{}
	woken := map[string]*atomic.Int32{}
	providers := map[string]*DBProvider{}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, id := range []string{"me", "succ"} {
		feed, n := &listenFeed{payloads: make(chan string)}, &atomic.Int32{}
		p := &DBProvider{prefix: "wake_", d: &postgres{}, pool: feed}
		feeds[id], woken[id], providers[id] = feed, n, p
		wg.Go(func() {
			p.watchNamed(ctx, "lease", id, watchHooks{
				wake:      func(bool) { n.Add(1) },
				live:      func(bool) {},
				listen:    true,
				handedFor: 400 * time.Millisecond,
			})
		})
	}
	for _, payload := range []string{"lease\tsucc", "lease\nsucc", "lease"} {
		for _, f := range feeds {
			f.payloads <- payload
		}
	}
	time.Sleep(4 * successorLead)
	if n := woken["me"].Load(); n != 0 {
		t.Fatalf("a follower was woken %d times by a handover; want none before the handed term expires", n)
	}
	if n := woken["succ"].Load(); n != 1 || !providers["succ"].wasHanded(LeaseRequest{Name: "lease", Instance: "succ"}) {
		t.Fatalf("the successor was woken %d times, told to read its term: see above; want once, told", n)
	}
	if providers["me"].wasHanded(LeaseRequest{Name: "lease", Instance: "me"}) {
		t.Fatal("a follower was told it was handed the term")
	}
	time.Sleep(400*time.Millisecond + successorLead)
	if n := woken["me"].Load(); n != 1 {
		t.Fatalf("a follower was woken %d times once the handed term expired; want once", n)
	}
	// A grant heard before the handed term expires cancels that wake.
	for _, payload := range []string{"lease\tsucc", "lease\nsucc", "lease", "lease\tother"} {
		feeds["me"].payloads <- payload
	}
	time.Sleep(400*time.Millisecond + 3*successorLead)
	if n := woken["me"].Load(); n != 1 {
		t.Fatalf("a follower was woken %d times in all; the grant after the handover should have cancelled the second", n)
	}
}

// The listening connection is lent to one attempt at most, of the
// instance and lease it was offered for: an attempt that takes it has it
// until it gives it back, however long that is or whatever happens to the
// listener's context; one not taken within lendWait is taken back, so
// that no later attempt finds it; a second listener of the provider lends
// nothing while the first's offer stands, and one that lends after the
// first's was taken takes back its own offer only.
func TestLendListener(t *testing.T) {
	type listenConn struct {
		Querier
		id int
	}
	p := &DBProvider{}
	lend := func(ctx context.Context, q Querier, instance string) (woken, returned chan struct{}) {
		woken, returned = make(chan struct{}), make(chan struct{})
		go func() {
			defer close(returned)
			p.lendListener(ctx, q, "leader", instance, func() { close(woken) })
		}()
		return woken, returned
	}
	req := func(instance string) LeaseRequest { return LeaseRequest{Name: "leader", Instance: instance} }
	connA, connB := listenConn{id: 1}, listenConn{id: 2}

	// Offered to a's attempt only; taken, it is held past lendWait and
	// past the context's end, until given back.
	ctx, cancel := context.WithCancel(context.Background())
	woken, returned := lend(ctx, connA, "a")
	<-woken
	for _, other := range []LeaseRequest{req("b"), {Name: "other", Instance: "a"}, {Name: "leader", Instance: "a", Poll: true}} {
		if l := p.takeOffer(other); l != nil {
			t.Fatalf("the attempt %+v took the connection offered to a's named attempt", other)
		}
	}
	l := p.takeOffer(req("a"))
	if l == nil || l.q != connA {
		t.Fatalf("a's attempt got %v, not its listening connection", l)
	}
	cancel()
	// Meanwhile another listener of the provider (b) lends and nobody
	// takes its offer: it takes back its own, not a's.
	wokenB, returnedB := lend(context.Background(), connB, "b")
	<-wokenB
	<-returnedB
	select {
	case <-returned:
		t.Fatal("a's listener went on while its attempt used the connection")
	case <-time.After(3 * lendWait):
	}
	if p.offer != nil {
		t.Errorf("an offer is left after b took its own back: %+v", p.offer)
	}
	close(l.done)
	select {
	case <-returned:
	case <-time.After(time.Second):
		t.Fatal("a's listener did not go on after the attempt gave its connection back")
	}

	// Not taken: taken back after lendWait, nothing left on offer.
	start := time.Now()
	woken, returned = lend(context.Background(), connA, "a")
	<-woken
	<-returned
	if waited := time.Since(start); waited < lendWait {
		t.Errorf("an offer nobody took was withdrawn after %v; want lendWait (%v)", waited, lendWait)
	}
	if p.offer != nil {
		t.Error("an offer nobody took is still on offer")
	}

	// A second listener while the first's offer stands: it wakes, lends
	// nothing.
	woken1, returned1 := lend(context.Background(), connA, "a")
	<-woken1
	woken2, returned2 := lend(context.Background(), connB, "b")
	<-woken2
	select {
	case <-returned2:
	case <-time.After(lendWait / 2):
		t.Error("a second listener waited to lend while the first's offer stood")
	}
	<-returned1
}

// stuckListen is a ListenPool that never gets a listening connection
// (an exhausted pool, a server that drops packets): its Listen waits for
// ctx, and counts its calls.
type stuckListen struct {
	Pool
	calls atomic.Int32
}

func (s *stuckListen) Listen(ctx context.Context, _ string, _ func(), _ func(string)) error {
	s.calls.Add(1)
	<-ctx.Done()
	return nil
}

// The watchers of one process on one database share one LISTEN. When the
// pool that holds it cannot give it a connection, another's takes over
// within listenReadyWithin, and both watchers hear through it; a watcher
// whose node is stopping (mayOwn false) never takes it over.
func TestSharedListenFailsOver(t *testing.T) {
	defer func(d time.Duration) { listenReadyWithin = d }(listenReadyWithin)
	listenReadyWithin = 100 * time.Millisecond
	stuck := &stuckListen{}
	feed := &listenFeed{payloads: make(chan string)}
	stopping := &stuckListen{}
	providers := []*DBProvider{
		{identity: "test-db", prefix: "wake_", d: &postgres{}, pool: stuck},
		{identity: "test-db", prefix: "wake_", d: &postgres{}, pool: feed},
		{identity: "test-db", prefix: "wake_", d: &postgres{}, pool: stopping},
	}
	for _, p := range providers {
		p.log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var hearing [3]atomic.Bool
	woken := make(chan int, 8)
	start := func(i int) {
		wg.Go(func() {
			providers[i].watchNamed(ctx, "lease", fmt.Sprint(i), watchHooks{
				wake:   func(bool) { woken <- i },
				live:   func(on bool) { hearing[i].Store(on) },
				listen: true,
				mayOwn: func() bool { return i != 2 },
			})
		})
	}
	start(0) // its pool takes the LISTEN first, and gets stuck
	for stuck.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	start(2) // stopping: never listens
	start(1)
	deadline := time.Now().Add(5 * time.Second)
	for !hearing[0].Load() || !hearing[1].Load() || !hearing[2].Load() {
		if time.Now().After(deadline) {
			t.Fatalf("hearing %v %v %v after 5s; want all three through the second pool's LISTEN", hearing[0].Load(), hearing[1].Load(), hearing[2].Load())
		}
		time.Sleep(time.Millisecond)
	}
	feed.payloads <- "lease" // a release that names no one: all wake at once
	got := map[int]bool{}
	for len(got) < 3 {
		select {
		case i := <-woken:
			got[i] = true
		case <-time.After(5 * time.Second):
			t.Fatalf("woken %v; want all three", got)
		}
	}
	if n := stopping.calls.Load(); n != 0 {
		t.Errorf("the stopping watcher's pool was asked to LISTEN %d times", n)
	}
}

// A term handed over by a release is trusted for its share of
// FenceTimeout: what was left of it by the database clock, scaled as
// FenceTimeout is to LeaseTTL, from before the statement that learnt it
// (or the release, in the same process) was sent; a term granted by the
// node's own attempt, for FenceTimeout.
func TestHandedTermTrust(t *testing.T) {
	c := &Cluster{cfg: Config{LeaseTTL: 2 * time.Second, FenceTimeout: 1800 * time.Millisecond}}
	start := mono()
	for _, tc := range []struct {
		handed, want time.Duration
	}{
		{0, 1800 * time.Millisecond},
		{600 * time.Millisecond, 540 * time.Millisecond},
		{2 * time.Second, 1800 * time.Millisecond},
		{5 * time.Second, 1800 * time.Millisecond},
	} {
		tm := c.newTerm(Lease{handed: tc.handed}, start)
		tm.end()
		if got := time.Duration(tm.until.Load() - start); got != tc.want {
			t.Errorf("a term handed over with %v left is trusted for %v, want %v", tc.handed, got, tc.want)
		}
	}
}

// takeHanded gives a term a release of this process handed over to the
// instance it was handed to, once, and only while it lasts; never one the
// instance took up or passed on by other means (tookTerm), or an earlier
// one, and nothing once its watcher ended (forgetHanded).
func TestTakeHanded(t *testing.T) {
	const key = "db\x00p\x00leader"
	t.Cleanup(func() { forgetHanded(key, "i") })
	handed := func(token uint64, lasts time.Duration, ago time.Duration) Lease {
		return Lease{Name: "leader", Instance: "i", FencingToken: token, handed: lasts, handedFrom: mono() - int64(ago)}
	}
	giveHanded(key, handed(9, time.Minute, 0))
	if _, ok := takeHanded(key, "j"); ok {
		t.Fatal("another instance took the handed term")
	}
	if got, ok := takeHanded(key, "i"); !ok || got.FencingToken != 9 {
		t.Fatalf("took %+v, %v; want token 9", got, ok)
	}
	if _, ok := takeHanded(key, "i"); ok {
		t.Fatal("the handed term was taken twice")
	}
	giveHanded(key, handed(9, time.Minute, 0))
	if _, ok := takeHanded(key, "i"); ok {
		t.Fatal("a term taken before was given again")
	}
	giveHanded(key, handed(10, time.Millisecond, time.Second))
	if _, ok := takeHanded(key, "i"); ok {
		t.Fatal("a handed term that has expired was taken")
	}
	// Read by the instance itself (it heard the grant by LISTEN first),
	// or passed on, before the release's answer reached this process.
	tookTerm(key, "i", 12)
	giveHanded(key, handed(12, time.Minute, 0))
	if _, ok := takeHanded(key, "i"); ok {
		t.Fatal("a term the instance took up by reading it was given again")
	}
	giveHanded(key, handed(13, time.Minute, 0))
	tookTerm(key, "i", 13)
	if _, ok := takeHanded(key, "i"); ok {
		t.Fatal("a term the instance passed on was taken")
	}
	forgetHanded(key, "i")
	giveHanded(key, handed(14, time.Minute, 0))
	if got, ok := takeHanded(key, "i"); !ok || got.FencingToken != 14 {
		t.Fatalf("took %+v, %v; want token 14", got, ok)
	}
	giveHanded("", handed(15, time.Minute, 0))
	if _, ok := takeHanded("", "i"); ok {
		t.Fatal("a term of an unnamed database was recorded")
	}
}
