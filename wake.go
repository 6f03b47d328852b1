package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// A ReleaseWatcher is an optional capability of a [Provider]: it tells a
// node at once when the lease is released, so that a follower tries to
// acquire it then rather than at its next poll. Correctness never depends
// on it: a node that hears nothing polls as before.
type ReleaseWatcher interface {
	// WatchReleases calls wake when the lease named name is released by a
	// node other than instance, until ctx is done, and then returns nil.
	// It calls live(true) while it hears releases made by other processes
	// (a PostgreSQL LISTEN is connected) and live(false) when it stops
	// hearing them; releases in this process are heard regardless.
	WatchReleases(ctx context.Context, name, instance string, wake func(), live func(bool)) error
}

// A ListenPool is a [Pool] that can LISTEN on PostgreSQL. Listen holds a
// connection of its own, LISTENs on channel, calls ready once it listens
// and notify with each notification's payload, until ctx is done (then it
// returns nil) or the connection fails (then it returns the error).
// clusterpgx's pools implement it.
type ListenPool interface {
	Pool
	Listen(ctx context.Context, channel string, ready func(), notify func(payload string)) error
}

// A ListenConnPool is a [ListenPool] whose listening connection can also
// run statements between two notifications: ListenConn is Listen, passing
// ready and notify the connection (as a Querier, to use only until they
// return). The follower a release names its successor then runs its
// attempt on that connection, whose database session has just delivered
// the notification, rather than on one of the pool's, idle until then:
// measured, the attempt took about a millisecond less. clusterpgx's
// pools implement it.
type ListenConnPool interface {
	ListenPool
	ListenConn(ctx context.Context, channel string, ready func(conn Querier), notify func(payload string, conn Querier)) error
}

// A listenWarmer is a dialect that readies a listening connection for
// the attempts it will run.
type listenWarmer interface {
	warmListener(ctx context.Context, conn Querier) error
}

// A lentConn is the listening connection, lent to the attempt of one
// instance on one lease, which closes done when it no longer uses it.
type lentConn struct {
	q              Querier
	name, instance string
	done           chan struct{}
}

// lendWait is how long the listener offers its connection to the attempt
// of a follower named successor, which its wake-up starts within
// microseconds when the node is not busy. Notifications meanwhile wait in
// the connection's buffer.
const lendWait = 5 * time.Millisecond

// lendListener offers conn, the listening connection, to the next attempt
// of instance on lease name (takeOffer), then calls wake, which starts
// that attempt; if the attempt takes conn within lendWait, it waits until
// the attempt is done with it, else it takes its offer back. A provider
// has one offer at a time: another listener's (several Clusters on one
// provider) makes this one wake without lending.
func (p *DBProvider) lendListener(ctx context.Context, conn Querier, name, instance string, wake func()) {
	l := &lentConn{q: conn, name: name, instance: instance, done: make(chan struct{})}
	p.lendMu.Lock()
	if p.offer != nil {
		p.lendMu.Unlock()
		wake()
		return
	}
	p.offer = l
	p.lendMu.Unlock()
	wake()
	t := time.NewTimer(lendWait)
	defer t.Stop()
	select {
	case <-l.done:
		return
	case <-t.C:
	case <-ctx.Done():
	}
	p.lendMu.Lock()
	mine := p.offer == l
	if mine {
		p.offer = nil
	}
	p.lendMu.Unlock()
	if !mine {
		<-l.done // taken meanwhile: the attempt still uses it
	}
}

// takeOffer takes the listening connection on offer if it is for req's
// attempt (its lease and instance, not a routine poll), else returns nil.
func (p *DBProvider) takeOffer(req LeaseRequest) *lentConn {
	p.lendMu.Lock()
	defer p.lendMu.Unlock()
	l := p.offer
	if l == nil || req.Poll || l.name != req.Name || l.instance != req.Instance {
		return nil
	}
	p.offer = nil
	return l
}

// acquireConn is the connection of req's attempt: the listening
// connection if it is on offer for it (lendListener), else one of the
// pool's.
func (p *DBProvider) acquireConn(ctx context.Context, req LeaseRequest) (Querier, func(), error) {
	if l := p.takeOffer(req); l != nil {
		return l.q, func() { close(l.done) }, nil
	}
	return p.conn(ctx)
}

// localReleases wakes the nodes of this process that watch a lease in the
// same database, whatever pool each reaches it through.
var localReleases = struct {
	sync.Mutex
	m map[string]map[*localWaiter]struct{}
}{m: map[string]map[*localWaiter]struct{}{}}

type localWaiter struct {
	instance string
	d        *designation
	learn    func(Lease)         // the lease was granted to another node; may be nil
	taken    func(holder string) // the same, for watchHooks.taken; may be nil
	ready    func() bool         // whether the node would try if woken; nil: always
}

// successorLead is how long a woken follower that is not the named
// successor waits before it tries: long enough that the successor's
// attempt reaches the lease row first, so that the others cannot overtake
// it (often its grant has committed by then, and they find the lease held
// and sleep until it expires); short enough that a successor that is gone,
// or cannot lead, costs little. Each waits a random time in [successorLead, 2*successorLead),
// so that they do not arrive together either. A variable for the tests.
var successorLead = 5 * time.Millisecond

// releaseKey names a lease in one database; "" when the database could not
// be named (then nothing is woken in process).
func (p *DBProvider) releaseKey(name string) string {
	if p.identity == "" {
		return ""
	}
	return p.identity + "\x00" + p.prefix + "\x00" + name
}

// localFallbacks is how many of this process's followers, besides the
// named successor, a release wakes (successorLead later), in case the
// successor's attempt fails. The others keep their schedule: they poll
// within 1.2 heartbeats, or hear the release by LISTEN. Waking them all
// made, at a handoff among a thousand members of one process whose
// successor was slower than successorLead, a thousand attempts at once,
// queued with the successor's grant. A variable for the tests.
var localFallbacks = 2

// announce tells the local watchers of lease name, but the holder's own,
// that it was released: the successor the release named, if it is one of
// them, at once, and localFallbacks of the others that would try (not
// stopping, holding off after Resign or leading) after a short delay.
// successor "" wakes localFallbacks+1 of them at once, unless pick is set
// (a dialect whose release names no successor): then one of them is the
// successor. It reports whether it woke any.
func (p *DBProvider) announce(name, holder, successor string, pick bool) (woke bool) {
	key := p.releaseKey(name)
	if key == "" {
		return false
	}
	localReleases.Lock()
	defer localReleases.Unlock()
	others := localFallbacks // woken besides the successor
	if successor == "" && !pick {
		others++ // no successor: they all try at once
	}
	for w := range localReleases.m[key] { // in random order
		if w.instance == holder {
			continue
		}
		w.d.releasedBy(holder)
		if w.instance != successor && w.ready != nil && !w.ready() {
			continue // a wake-up it would not act on
		}
		if pick && successor == "" {
			successor = w.instance
		}
		if w.instance != successor {
			if others == 0 {
				continue
			}
			others--
		}
		w.d.hear(successor)
		woke = true
	}
	return woke
}

// announceTaken tells the local watchers of lease name, but the new
// holder's own, that l was granted: a follower that heard the release and
// waits out successorLead before it tries need not try, as its attempt
// would be refused; it learns of the new term from l instead (its
// leader-changed event), as that attempt would have told it. (It keeps
// its own schedule otherwise: it polls, or, hearing releases, sleeps
// until the term it knew of was to expire, and learns the new expiry
// then.) At a handoff among many members of one process this saves one
// refused statement per member, all sent within successorLead of each
// other, which queue with the winner's first renew.
func (p *DBProvider) announceTaken(name string, l Lease) {
	key := p.releaseKey(name)
	if key == "" {
		return
	}
	localReleases.Lock()
	defer localReleases.Unlock()
	for w := range localReleases.m[key] {
		if w.instance == l.Instance {
			continue
		}
		w.d.taken(l.Instance)
		if w.learn != nil {
			w.learn(l)
		}
		if w.taken != nil {
			w.taken(l.Instance)
		}
	}
}

// WatchReleases implements [ReleaseWatcher]: releases in this process are
// heard through memory, and on PostgreSQL, when the Pool is a
// [ListenPool], releases by other processes through LISTEN on channel
// <prefix>lease (the release statement NOTIFYs it), reconnecting after a
// failure while ctx lasts. The watchers of one process on one database
// and table prefix share one LISTEN, held by the pool of one of them and
// by another's when that one stops. A release names one successor, which is woken at
// once; others are woken successorLead to twice that later (in this
// process, localFallbacks of them), so that they find the successor's
// term rather than wait on its row.
func (p *DBProvider) WatchReleases(ctx context.Context, name, instance string, wake func(), live func(bool)) error {
	return p.watchNamed(ctx, name, instance, watchHooks{wake: func(bool) { wake() }, live: live, listen: true})
}

// watchHooks are what watchNamed calls, and whether it LISTENs.
type watchHooks struct {
	// wake is told of a release, and whether it named this instance its
	// successor.
	wake func(named bool)
	// learn, if not nil, is told of a grant to another node of this
	// process (announceTaken).
	learn func(Lease)
	// taken, if not nil, is told the instance of another node granted the
	// lease, in this process (after learn) or, by LISTEN, in another.
	taken func(holder string)
	// ready, if not nil, reports whether the node would try if woken; a
	// release in this process wakes, besides its successor, only
	// localFallbacks of the nodes that would.
	ready func() bool
	// live is told when LISTEN starts and stops hearing releases by other
	// processes.
	live func(bool)
	// registered, if not nil, is called once the releases of this process
	// reach the watcher.
	registered func()
	// listen false hears releases in this process only
	// (Config.PollOnly), never through LISTEN.
	listen bool
	// mayOwn, if not nil, reports whether this watcher's pool may hold
	// the LISTEN its process shares: not once its node is stopping, whose
	// pool is about to go.
	mayOwn func() bool
	// handedFor, if not zero, is how long a term a release hands over
	// lasts until its holder renews it (the handing-over release's share
	// of the TTL): a follower that hears another process's release hand
	// the term to another member tries once that long after, in case the
	// member never takes it up.
	handedFor time.Duration
}

// watchNamed is WatchReleases, telling h.wake whether the release named
// instance its successor, so that a node that cannot take the lease (it
// holds off after Resign, or is stopping) can pass the turn on
// (passRelease): the others then try at once rather than after
// successorLead.
func (p *DBProvider) watchNamed(ctx context.Context, name, instance string, h watchHooks) error {
	d := designated(instance, h.wake)
	defer d.stop()
	key := p.releaseKey(name)
	defer forgetHanded(key, instance)
	hear := d.hear
	if key != "" {
		w := &localWaiter{instance: instance, d: d, learn: h.learn, taken: h.taken, ready: h.ready}
		localReleases.Lock()
		if localReleases.m[key] == nil {
			localReleases.m[key] = map[*localWaiter]struct{}{}
		}
		localReleases.m[key][w] = struct{}{}
		localReleases.Unlock()
		defer func() {
			localReleases.Lock()
			delete(localReleases.m[key], w)
			if len(localReleases.m[key]) == 0 {
				delete(localReleases.m, key)
			}
			localReleases.Unlock()
		}()
	}
	if h.registered != nil {
		h.registered()
	}
	lp, ok := p.pool.(ListenPool)
	if !ok || !p.d.notifies() || !h.listen {
		<-ctx.Done()
		return nil
	}
	// A release sends two payloads in a row (schema/postgres.sql): the
	// lease name, a newline and the successor's instance; then the name
	// alone, which older nodes act on. The name alone after a named one
	// is its companion; without one, an older node released. A grant
	// sends the name, a tab and the new holder's instance; a release that
	// hands the term over sends its grant first, then the other two.
	named, session, grantedTo := false, uint64(0), ""
	sub := &listenSub{p: p, lp: lp, live: h.live, mayOwn: h.mayOwn}
	sub.handle = func(ctx context.Context, payload string, sess uint64, conn Querier) (after func()) {
		if sess != session {
			named, session, grantedTo = false, sess, "" // a new LISTEN session: no companion pending
		}
		if lease, holder, ok := strings.Cut(payload, "\t"); ok { // a name holds no control character
			if lease != name {
				return nil
			}
			grantedTo = holder // a release that names holder next handed it the term
			if holder == instance {
				// Handed the term, by a release in another process (or
				// this one, whose successor took it already): the attempt
				// the release's next payload starts reads it first.
				p.markHanded(name, instance)
				return nil
			}
			// Granted: a wake still pending would only be refused. No
			// quiet time, as a grant in this process sets: by LISTEN a
			// grant comes after the release it follows (commit order); the
			// copy of a release made in this process can come later, and
			// then arms a wake that makes one refused attempt. A quiet time
			// could not be ended by the holder's own release, as a release
			// heard by LISTEN does not say who made it.
			d.stop()
			if h.taken != nil {
				h.taken(holder)
			}
			return nil
		}
		lease, successor, ok := strings.Cut(payload, "\n") // nor a newline (Config.LeaseName)
		handed := ok && lease == name && successor == grantedTo
		if lease == name {
			grantedTo = ""
		}
		switch {
		case lease != name:
		case handed && successor != instance:
			// The successor holds the term: nothing to try, unless it
			// never takes it up (it is gone, say): then when it expires.
			named = true
			if h.handedFor > 0 {
				d.expiry(h.handedFor + successorLead + rand.N(successorLead))
			}
		case ok:
			named = true
			if successor == instance && conn != nil {
				return func() {
					p.lendListener(ctx, conn, name, instance, func() {
						sub.mu.Lock() // not once its watcher has returned
						defer sub.mu.Unlock()
						if !sub.gone {
							hear(successor)
						}
					})
				}
			}
			hear(successor)
		case named:
			named = false
		default:
			hear("")
		}
		return nil
	}
	return p.listenShared(ctx, p.prefix+"lease", sub)
}

// One LISTEN per process: the watchers of this process that hear the
// releases of one database and table prefix share one listening
// connection, taken from the pool of one of them (the owner), and each is
// handed every notification. PostgreSQL before 19 wakes every listening
// session of the database at each NOTIFY, whatever its channel, and each
// woken session then wakes its process: with a listening connection per
// watcher, a release among three members of one process woke three
// server processes beside the releasing one, and the handoff took about
// 2 ms longer than with none (BENCHMARKS.md). When the owner stops or its
// connection fails, another watcher's pool listens (not the pool of a
// node that is stopping). A watcher's wake and live are then called on
// the owner's goroutine, one watcher after another: a lent listening
// connection holds the notifications of every watcher until the attempt
// is done with it, as it holds the successor's own.
var listenGroups = struct {
	sync.Mutex
	m map[string]*listenGroup
}{m: map[string]*listenGroup{}}

// A listenGroup is the watchers that share one LISTEN.
type listenGroup struct {
	key     string // in listenGroups; "" for a group of one outside it
	mu      sync.Mutex
	subs    map[*listenSub]struct{}
	owner   *listenSub    // whose pool listens; nil when none does
	vacant  chan struct{} // closed when the owner stops listening
	session uint64        // counts the LISTEN sessions begun

	liveMu sync.Mutex // orders the calls of the watchers' live hooks
	live   bool       // the owner's LISTEN hears
}

// A listenSub is one watcher of a listenGroup.
type listenSub struct {
	p  *DBProvider
	lp ListenPool
	// handle is told each notification, the LISTEN session it came on, and
	// the listening connection when it is this watcher's provider's (it
	// may then be lent to an attempt, by the function handle returns,
	// which runs once every watcher has been told).
	handle func(ctx context.Context, payload string, session uint64, conn Querier) (after func())
	live   func(bool)
	mayOwn func() bool // nil: always
	told   bool        // live(true) was its last call; under the group's liveMu

	mu   sync.Mutex // held while handle runs
	gone bool       // it left the group: handle is not called again
}

// listenShared runs sub's share of the LISTEN on channel until ctx is
// done: it listens through its own pool while no other watcher of the
// group does, and otherwise waits for that one to stop.
func (p *DBProvider) listenShared(ctx context.Context, channel string, sub *listenSub) error {
	g := joinListen(p.listenKey(channel), sub)
	defer g.leave(sub)
	for backoff := 100 * time.Millisecond; ; {
		g.mu.Lock()
		if g.owner != nil || sub.mayOwn != nil && !sub.mayOwn() {
			vacant := g.vacant
			g.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil
			case <-vacant:
				continue
			}
		}
		g.owner = sub
		g.session++
		session := g.session
		g.mu.Unlock()
		err := p.listenFor(ctx, g, sub, channel, session)
		g.setLive(false)
		g.mu.Lock()
		g.owner = nil
		close(g.vacant)
		g.vacant = make(chan struct{})
		g.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		p.log.DebugContext(ctx, "cluster: LISTEN for lease releases failed; polling until it is back", "channel", channel, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff + rand.N(backoff/2)): // spread out, after a server restart
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// listenFor LISTENs on channel through sub's pool, the group's owner,
// handing each notification to every watcher of g.
func (p *DBProvider) listenFor(ctx context.Context, g *listenGroup, sub *listenSub, channel string, session uint64) error {
	listen := func(ctx context.Context, channel string, ready func(Querier), notify func(string, Querier)) error {
		return sub.lp.Listen(ctx, channel, func() { ready(nil) }, func(payload string) { notify(payload, nil) })
	}
	if lcp, ok := sub.lp.(ListenConnPool); ok {
		listen = lcp.ListenConn
	}
	// A pool that cannot give a connection (exhausted, or its server
	// unreachable without an error) would leave the whole group deaf: the
	// LISTEN must be ready within listenReadyWithin, or another pool tries.
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watchdog := time.AfterFunc(listenReadyWithin, cancel)
	defer watchdog.Stop()
	var subs []*listenSub
	var afters []func()
	err := listen(lctx, channel, func(conn Querier) {
		watchdog.Stop()
		if w, ok := p.d.(listenWarmer); ok && conn != nil && p.mayWarm(lctx) {
			// The session the successor's attempt will run on: prepare
			// and plan its statement now.
			wctx, cancel := context.WithTimeout(lctx, warmBudget)
			if err := w.warmListener(wctx, conn); err != nil {
				p.warmPause.Store(time.Now().Add(warmPauseAfterFailure).UnixNano())
				p.log.DebugContext(lctx, "cluster: warming the listening session failed", "err", err)
			}
			cancel()
		}
		g.setLive(true)
	}, func(payload string, conn Querier) {
		subs = g.members(subs[:0])
		afters = afters[:0]
		for _, s := range subs {
			lend := conn
			if s.p != p {
				lend = nil // another pool's attempt runs on a connection of its own
			}
			s.mu.Lock()
			if !s.gone {
				if after := s.handle(lctx, payload, session, lend); after != nil {
					afters = append(afters, after)
				}
			}
			s.mu.Unlock()
		}
		for _, after := range afters {
			after()
		}
	})
	if err == nil && ctx.Err() == nil {
		err = fmt.Errorf("cluster: LISTEN %s: no listening connection within %v", channel, listenReadyWithin)
	}
	return err
}

// listenReadyWithin bounds how long a pool may take to LISTEN for its
// process. A variable for the tests.
var listenReadyWithin = 5 * time.Second

// listenKey names the LISTEN on channel in p's database; "" when the
// database could not be named (then p's watcher listens alone).
func (p *DBProvider) listenKey(channel string) string {
	if p.identity == "" {
		return ""
	}
	return p.identity + "\x00" + channel
}

// joinListen adds sub to the group of key (a group of its own for key ""),
// telling it at once that it hears if the group does.
func joinListen(key string, sub *listenSub) *listenGroup {
	listenGroups.Lock()
	g := listenGroups.m[key]
	if g == nil {
		g = &listenGroup{key: key, subs: map[*listenSub]struct{}{}, vacant: make(chan struct{})}
		if key != "" {
			listenGroups.m[key] = g
		}
	}
	g.mu.Lock()
	g.subs[sub] = struct{}{}
	g.mu.Unlock()
	listenGroups.Unlock()
	g.liveMu.Lock()
	defer g.liveMu.Unlock()
	if g.live && !sub.told {
		sub.live(true)
		sub.told = true
	}
	return g
}

// leave removes sub from g, dropping g once it has no watcher.
func (g *listenGroup) leave(sub *listenSub) {
	sub.mu.Lock()
	sub.gone = true // its watcher is ending: nothing may wake it after
	sub.mu.Unlock()
	listenGroups.Lock()
	g.mu.Lock()
	delete(g.subs, sub)
	empty := len(g.subs) == 0
	g.mu.Unlock()
	if empty && g.key != "" {
		delete(listenGroups.m, g.key)
	}
	listenGroups.Unlock()
	g.liveMu.Lock()
	defer g.liveMu.Unlock()
	if sub.told {
		sub.live(false)
		sub.told = false
	}
}

// members appends g's watchers to buf.
func (g *listenGroup) members(buf []*listenSub) []*listenSub {
	g.mu.Lock()
	defer g.mu.Unlock()
	for s := range g.subs {
		buf = append(buf, s)
	}
	return buf
}

// setLive records whether the group's LISTEN hears and tells its watchers
// when that changes.
func (g *listenGroup) setLive(on bool) {
	g.liveMu.Lock()
	defer g.liveMu.Unlock()
	if g.live == on {
		return
	}
	g.live = on
	for _, s := range g.members(nil) {
		if s.told != on {
			s.live(on)
			s.told = on
		}
	}
}

// passRelease tells the other watchers of lease name that instance, the
// successor a release named, will not take it. If the release handed it
// the term (handingOver), it releases that term, handing over nothing (a
// member named next that cannot lead either would hand it back), which
// names the next successor and wakes the others as a release does;
// otherwise, on PostgreSQL a NOTIFY of the lease name
// alone wakes the listeners at once, and in this process localFallbacks+1
// of the others are woken at once.
func (p *DBProvider) passRelease(ctx context.Context, name, holder, instance string) error {
	if ho, ok := p.d.(handingOver); ok {
		key := p.releaseKey(name)
		takeHanded(key, instance) // ended below: never to be taken later
		r, err := p.releaseNamed(ctx, name, instance, ho.passTerm(), name, holder, instance)
		if err != nil || r.ended {
			if r.ended {
				tookTerm(key, instance, r.token)
			}
			return err
		}
	}
	p.announce(name, instance, "", false)
	ps, ok := p.d.(passer)
	if !ok {
		return nil
	}
	conn, release, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	if err := ps.pass(ctx, conn, name); err != nil {
		return p.wrap("pass on lease "+quote(name), err)
	}
	return nil
}

// A hearingMarker is a dialect whose releases name a successor among the
// members recorded as hearing them (PostgreSQL's): markHearing records
// that instance, a candidate, does, and reports whether its active row
// was there.
type hearingMarker interface {
	markHearing(ctx context.Context, conn Querier, scope, instance string) (bool, error)
}

// markHearing records that instance, a candidate, hears the releases of
// lease scope by LISTEN, so that a release may name it successor. Where
// releases name none, it does nothing. A missing row is an error wrapping
// errNotMember (the node joins again).
func (p *DBProvider) markHearing(ctx context.Context, scope, instance string) error {
	hm, ok := p.d.(hearingMarker)
	if !ok {
		return nil
	}
	conn, release, err := p.conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	there, err := hm.markHearing(ctx, conn, scope, instance)
	if err != nil {
		return p.wrap("record that this node hears releases", err)
	}
	if !there {
		return fmt.Errorf("cluster: record that this node hears releases: instance %s has no active row under lease name %q: %w", instance, scope, errNotMember)
	}
	return nil
}

// A passer is a dialect whose releases notify other processes: pass
// notifies that lease name is free for everyone to try.
type passer interface {
	pass(ctx context.Context, conn Querier, name string) error
}

// A designation is how the watcher of one instance hears releases that
// name a successor: hear calls wake(true) at once when the successor is
// the instance, wake(false) at once when it is "" (a release that named
// none), else wake(false) after a random delay in [successorLead,
// 2*successorLead), once however many releases it hears meanwhile.
type designation struct {
	instance string
	wake     func(named bool)

	mu      sync.Mutex
	pending *time.Timer
	due     time.Time
	// expiring wakes the node when a term handed to another member
	// expires, in case that member never takes it up (expiry).
	expiring *time.Timer
	// After a grant to quietHolder, releases that would delay a wake are
	// ignored until quiet: on PostgreSQL a release is heard twice, in
	// process and by LISTEN, and the second can come after the grant.
	quiet       time.Time
	quietHolder string
}

func designated(instance string, wake func(named bool)) *designation {
	return &designation{instance: instance, wake: wake}
}

func (d *designation) hear(successor string) {
	if successor == "" || successor == d.instance || successorLead <= 0 {
		// At once; a delayed wake still pending (a named release heard
		// before, whose successor passed the turn on) would only make a
		// second, refused attempt.
		d.mu.Lock()
		if d.pending != nil && d.pending.Stop() {
			d.due = time.Time{}
		}
		d.mu.Unlock()
		d.wake(successor == d.instance)
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if now := time.Now(); now.Before(d.due) || now.Before(d.quiet) {
		return // a wake is pending already, or the lease was just granted
	}
	delay := successorLead + rand.N(successorLead)
	d.due = time.Now().Add(delay)
	if d.pending == nil {
		d.pending = time.AfterFunc(delay, func() { d.wake(false) })
	} else {
		d.pending.Reset(delay)
	}
}

// taken tells d that the lease was granted to holder: a pending delayed
// wake is cancelled, and the releases that would delay one are ignored
// for 2*successorLead, unless holder itself releases (releasedBy).
func (d *designation) taken(holder string) {
	d.stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.quiet, d.quietHolder = time.Now().Add(2*successorLead), holder
}

// releasedBy tells d that holder released the lease in this process: if
// it is the node whose grant began the quiet time (it gave the term back
// at once: it was shutting down, or could not verify the database), the
// quiet time ends, as this release is a new one.
func (d *designation) releasedBy(holder string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if holder != "" && holder == d.quietHolder {
		d.quiet, d.quietHolder = time.Time{}, ""
	}
}

// stop cancels a pending wake (when the lease was granted meanwhile, or
// the watcher ends).
func (d *designation) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending != nil && d.pending.Stop() {
		d.due = time.Time{}
	}
	if d.expiring != nil {
		d.expiring.Stop()
	}
}

// expiry wakes the node after delay, when a term a release handed to
// another member expires unless that member renewed it; a grant heard
// meanwhile cancels it (stop).
func (d *designation) expiry(delay time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.expiring == nil {
		d.expiring = time.AfterFunc(delay, func() { d.wake(false) })
	} else {
		d.expiring.Reset(delay)
	}
}

// watchReleases is the goroutine that hears releases for a candidate. It
// calls registered once the releases of this process reach it (at once
// for a provider other than the default one, whose watcher it cannot
// see into), so that New returns only when they do.
func (c *Cluster) watchReleases(ctx context.Context, w ReleaseWatcher, registered func()) {
	defer c.wg.Done()
	wake := func() {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	// When the listener starts, it has taken a connection from the pool,
	// often the one the attempts ran on, which the warm-up had prepared
	// (provider_db.go): a follower tries once, within half a heartbeat
	// (spread out, as every node's listener starts again after a server
	// restart), which opens and warms the connection the next handoff
	// runs on, instead of the handoff waiting to open one.
	var mu sync.Mutex
	var soon *time.Timer
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		if soon != nil {
			soon.Stop()
		}
	}()
	// wakeSoon wakes the node within half a heartbeat, at a random time:
	// the watchers of one process share one LISTEN (wake.go) and all hear
	// it start, or stop, at once.
	wakeSoon := func() {
		mu.Lock()
		defer mu.Unlock()
		d := rand.N(c.cfg.HeartbeatInterval/2 + 1)
		if soon == nil {
			soon = time.AfterFunc(d, wake)
		} else {
			soon.Reset(d)
		}
	}
	live := func(on bool) {
		was := c.hearing.Swap(on)
		switch {
		case was && !on:
			wakeSoon() // a follower sleeping until the lease's expiry polls again
		case on && !was:
			if _, std := w.(*DBProvider); std {
				// On the goroutine of the LISTEN this node's process
				// shares (its own watcher's or another node's), while its
				// watcher goroutine, counted in wg, has not returned
				// (another provider's WatchReleases may call live from
				// one that is not counted; then the heartbeat records it).
				c.markHearingLater(ctx) // a release may name this node now
			}
			wakeSoon()
		}
	}
	var err error
	// Only the default provider itself: a provider that embeds it may
	// override WatchReleases, and then that is what runs.
	if nw, ok := w.(*DBProvider); ok {
		err = nw.watchNamed(ctx, c.cfg.LeaseName, c.instance, watchHooks{wake: func(named bool) {
			if !named || c.mayTakeOver() {
				wake()
				return
			}
			if c.term.Load() != nil || c.retiring.Load() != nil {
				// This node holds the lease: a late copy of the release
				// that named it (a release is heard twice, in this process
				// and by LISTEN), heard after it took the lease. A pass
				// would wake every follower for an attempt the lease
				// refuses.
				return
			}
			// Named, but this node will not try: pass the turn on, so the
			// others need not wait out successorLead. (The watcher runs
			// until its goroutine, counted in wg, returns.) Between two
			// heartbeat steps: a step that began meanwhile (the hold-off
			// after Resign ended) may have taken up a term the release
			// handed this node, which must then not be ended under it.
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				c.stepMu.Lock()
				defer c.stepMu.Unlock()
				if c.term.Load() != nil || c.retiring.Load() != nil {
					return // it leads now
				}
				if c.mayTakeOver() {
					wake() // it may try now: its attempt takes up a handed term
					return
				}
				pctx, cancel := context.WithTimeout(ctx, c.cfg.HeartbeatInterval)
				defer cancel()
				if err := nw.passRelease(pctx, c.cfg.LeaseName, c.cfg.NodeID, c.instance); err != nil {
					c.log.DebugContext(ctx, "cluster: passing on a release this node cannot take failed; the others try a few milliseconds later", "err", err)
				}
			}()
		}, learn: func(l Lease) {
			// Another node of this process was granted the lease: what the
			// attempt it spares this node would have told it. Not once this
			// node is stopping: Shutdown waits for that grant, and its
			// lease-released stays the last event.
			if c.down.Load() {
				return
			}
			c.observeNewer(observed{token: l.FencingToken}, l.Holder, l.Endpoint)
		}, taken: func(string) {
			select {
			case c.succeeded <- struct{}{}:
			default:
			}
		}, ready: c.wouldTry, live: live, registered: registered, listen: !c.cfg.PollOnly,
			mayOwn: func() bool { return !c.down.Load() }, handedFor: c.cfg.LeaseTTL * handedShare / 100})
	} else {
		registered()
		err = w.WatchReleases(ctx, c.cfg.LeaseName, c.instance, wake, live)
	}
	if err != nil {
		c.log.WarnContext(ctx, "cluster: cannot hear lease releases; polling", "err", err)
	}
	c.hearing.Store(false)
}

// mayTakeOver reports whether this node would try to acquire the lease if
// woken now: it neither holds it, nor is stopping, nor holds off after
// Resign, nor stopped campaigning after a detected rollback.
func (c *Cluster) mayTakeOver() bool {
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	return !stopped && c.wouldTry()
}

// wouldTry is mayTakeOver without its lock, for announce, which runs
// under localReleases' (a node that began stopping a moment ago may still
// count).
func (c *Cluster) wouldTry() bool {
	return !c.down.Load() && c.term.Load() == nil && c.retiring.Load() == nil &&
		mono() >= c.holdUntil.Load() && !c.haltedFlag.Load()
}

// handedTerms holds the terms that releases made in this process handed
// to a successor, keyed by releaseKey, NUL and the successor's instance,
// for that successor's next attempt if it is a node of this process
// (takeHanded): it then leads without a statement of its own. A term no
// attempt took is dropped once handedWait has passed. Each entry also
// keeps the highest token of a term its instance took up, was granted or
// passed on by other means (tookTerm), until its watcher ends
// (forgetHanded): a term given after that, at or below it, is never
// taken, as it may have ended since (the successor heard the release's
// grant by LISTEN before the release statement returned here, and read
// the term, or passed it on).
var handedTerms = struct {
	sync.Mutex
	m map[string]handedTerm
}{m: map[string]handedTerm{}}

type handedTerm struct {
	l     Lease     // the term handed; zero when none is waiting
	until time.Time // when l is dropped
	took  uint64    // the highest token the instance took up or passed on
}

// giveHanded records l, a term a release handed to l.Instance on the
// lease that key names ("" for none: nothing is recorded).
func giveHanded(key string, l Lease) {
	if key == "" {
		return
	}
	now := time.Now()
	handedTerms.Lock()
	defer handedTerms.Unlock()
	for k, e := range handedTerms.m {
		if e.l.FencingToken != 0 && now.After(e.until) {
			e.l = Lease{}
			handedTerms.m[k] = e
		}
		if e.l.FencingToken == 0 && e.took == 0 {
			delete(handedTerms.m, k)
		}
	}
	k := key + "\x00" + l.Instance
	e := handedTerms.m[k]
	if e.took >= l.FencingToken {
		return // taken up or passed on already
	}
	e.l, e.until = l, now.Add(handedWait)
	handedTerms.m[k] = e
}

// tookTerm notes that instance took up, was granted or passed on the term
// with token on the lease that key names, by other means than takeHanded.
func tookTerm(key, instance string, token uint64) {
	if key == "" {
		return
	}
	handedTerms.Lock()
	defer handedTerms.Unlock()
	k := key + "\x00" + instance
	e := handedTerms.m[k]
	e.took = max(e.took, token)
	if e.l.FencingToken <= e.took {
		e.l = Lease{}
	}
	handedTerms.m[k] = e
}

// forgetHanded drops what handedTerms holds for instance on the lease that
// key names: its watcher has ended.
func forgetHanded(key, instance string) {
	handedTerms.Lock()
	defer handedTerms.Unlock()
	delete(handedTerms.m, key+"\x00"+instance)
}

// takeHanded removes and returns the term handed to instance on the lease
// that key names, if a release of this process recorded one that has time
// left and that instance has not taken up or passed on.
func takeHanded(key, instance string) (Lease, bool) {
	if key == "" {
		return Lease{}, false
	}
	handedTerms.Lock()
	defer handedTerms.Unlock()
	k := key + "\x00" + instance
	e, ok := handedTerms.m[k]
	if !ok || e.l.FencingToken == 0 {
		return Lease{}, false
	}
	l := e.l
	e.l, e.took = Lease{}, max(e.took, l.FencingToken)
	handedTerms.m[k] = e
	if time.Now().After(e.until) || mono() >= monoAfter(l.handedFrom, l.handed) {
		return Lease{}, false
	}
	return l, true
}
