package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// clientGoTimings maps this package's timings onto client-go's
// LeaderElectionConfig:
//
//   - LeaseDuration = LeaseTTL: how long a lease lasts without renewal
//     (client-go counts it on each candidate's own clock, from when that
//     candidate last saw the record change);
//   - RenewDeadline = FenceTimeout's default, LeaseTTL - heartbeat: how
//     long a leader keeps trying to renew, and so keeps believing it
//     leads, before it gives up. It is the closest equivalent of
//     Config.FenceTimeout (client-go needs it below LeaseDuration and
//     above 1.2 × RetryPeriod);
//   - RetryPeriod = HeartbeatInterval: the leader renews, and candidates
//     try, every RetryPeriod; candidates add a jitter of up to 1.2 ×
//     RetryPeriod, so they try every 200–440ms at 200ms.
func clientGoTimings(tm timings) (lease, renew, retry time.Duration) {
	return tm.ttl, tm.ttl - tm.heartbeat, tm.heartbeat
}

// clientGoSystem runs client-go LeaderElectors over one in-memory
// clientset whose Lease objects keep resource versions, as an API server
// does (see leaseStore).
type clientGoSystem struct {
	client          kubernetes.Interface
	lease           string
	tm              timings
	releaseOnCancel bool
	acq             chan acquisition

	mu      sync.Mutex
	members [slots]*clientGoMember
	gen     int
}

type clientGoMember struct {
	le     *leaderelection.LeaderElector
	cancel context.CancelFunc
	done   chan struct{}
}

// newClientGo returns client-go electors that release their lease when
// their context is cancelled (ReleaseOnCancel) or not, the crash trial.
func newClientGo(lease string, tm timings, releaseOnCancel bool) *clientGoSystem {
	return &clientGoSystem{
		client:          leaseClientset(),
		lease:           lease,
		tm:              tm,
		releaseOnCancel: releaseOnCancel,
		acq:             make(chan acquisition, 256),
	}
}

func (s *clientGoSystem) name() string                     { return "client-go" }
func (s *clientGoSystem) size() int                        { return slots }
func (s *clientGoSystem) acquisitions() <-chan acquisition { return s.acq }

func (s *clientGoSystem) start(_ context.Context, slot int) error {
	s.mu.Lock()
	s.gen++
	id := fmt.Sprintf("client-go-%d-g%d", slot, s.gen)
	s.mu.Unlock()
	lease, renew, retry := clientGoTimings(s.tm)
	m := &clientGoMember{done: make(chan struct{})}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Name: s.lease, Namespace: "default"},
			Client:     s.client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: id},
		},
		LeaseDuration:   lease,
		RenewDeadline:   renew,
		RetryPeriod:     retry,
		ReleaseOnCancel: s.releaseOnCancel,
		Callbacks: leaderelection.LeaderCallbacks{
			// client-go calls it on a goroutine of its own right after the
			// acquisition, when IsLeader has just turned true.
			OnStartedLeading: func(context.Context) { report(s.acq, slot, time.Now()) },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return err
	}
	m.le = le
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() { le.Run(ctx); close(m.done) }()
	s.mu.Lock()
	s.members[slot] = m
	s.mu.Unlock()
	return nil
}

func (s *clientGoSystem) take(slot int) *clientGoMember {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.members[slot]
	s.members[slot] = nil
	return m
}

// leads is client-go's own check, IsLeader: the last record this elector
// observed names it.
func (s *clientGoSystem) leads(slot int) bool {
	s.mu.Lock()
	m := s.members[slot]
	s.mu.Unlock()
	return m != nil && m.le.IsLeader()
}

// release cancels the leader's context: with ReleaseOnCancel, Run writes
// an empty holder before it returns.
func (s *clientGoSystem) release(_ context.Context, slot int) (bool, error) {
	if !s.releaseOnCancel {
		return true, fmt.Errorf("client-go: this system was made for crash trials (ReleaseOnCancel false)")
	}
	m := s.take(slot)
	if m == nil {
		return true, errEmptySlot
	}
	m.cancel()
	<-m.done
	return true, nil
}

// crash cancels the leader's context without ReleaseOnCancel: Run stops
// renewing and returns, leaving the record to expire.
func (s *clientGoSystem) crash(_ context.Context, slot int) error {
	if s.releaseOnCancel {
		return fmt.Errorf("client-go: this system was made for handoff trials (ReleaseOnCancel true)")
	}
	m := s.take(slot)
	if m == nil {
		return errEmptySlot
	}
	m.cancel()
	<-m.done
	return nil
}

func (s *clientGoSystem) stop(_ context.Context, slot int) {
	if m := s.take(slot); m != nil {
		m.cancel()
		<-m.done
	}
}

func (s *clientGoSystem) close(ctx context.Context) error {
	for slot := range slots {
		s.stop(ctx, slot)
	}
	return nil
}

// leaseClientset returns a fake clientset whose Leases behave as an API
// server's do for LeaseLock: Get, Create and Update, with a resource
// version checked on Update (a stale one is a Conflict). The plain fake
// tracker checks none, so two candidates that read the same free record
// could both "acquire" it; against a real API server one gets a Conflict.
func leaseClientset() kubernetes.Interface {
	c := fake.NewClientset()
	st := &leaseStore{leases: map[string]*coordinationv1.Lease{}}
	c.PrependReactor("*", "leases", st.react)
	return c
}

type leaseStore struct {
	mu     sync.Mutex
	rv     int64
	leases map[string]*coordinationv1.Lease
}

var leasesResource = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

func (st *leaseStore) react(action k8stesting.Action) (bool, runtime.Object, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	key := func(name string) string { return action.GetNamespace() + "/" + name }
	// By verb: an update action also satisfies CreateAction.
	switch action.GetVerb() {
	case "get":
		a := action.(k8stesting.GetAction)
		l, ok := st.leases[key(a.GetName())]
		if !ok {
			return true, nil, apierrors.NewNotFound(leasesResource, a.GetName())
		}
		return true, l.DeepCopy(), nil
	case "create":
		l := action.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		if _, ok := st.leases[key(l.Name)]; ok {
			return true, nil, apierrors.NewAlreadyExists(leasesResource, l.Name)
		}
		st.rv++
		l.Namespace = action.GetNamespace()
		l.ResourceVersion = strconv.FormatInt(st.rv, 10)
		st.leases[key(l.Name)] = l
		return true, l.DeepCopy(), nil
	case "update":
		l := action.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		cur, ok := st.leases[key(l.Name)]
		if !ok {
			return true, nil, apierrors.NewNotFound(leasesResource, l.Name)
		}
		if l.ResourceVersion != cur.ResourceVersion {
			return true, nil, apierrors.NewConflict(leasesResource, l.Name,
				fmt.Errorf("resource version %s is not the current %s", l.ResourceVersion, cur.ResourceVersion))
		}
		st.rv++
		l.Namespace = action.GetNamespace()
		l.ResourceVersion = strconv.FormatInt(st.rv, 10)
		st.leases[key(l.Name)] = l
		return true, l.DeepCopy(), nil
	}
	return false, nil, nil
}
