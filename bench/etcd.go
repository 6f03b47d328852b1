package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// etcdServer is a single-member etcd embedded in this process, on
// loopback ports, with its data in a temporary directory removed by close.
// It fsyncs its WAL as a real one does.
type etcdServer struct {
	e        *embed.Etcd
	dir      string
	endpoint string
}

func startEtcd() (*etcdServer, error) {
	dir, err := os.MkdirTemp("", "bench-etcd-")
	if err != nil {
		return nil, err
	}
	clientURL, err := freeURL()
	if err != nil {
		return nil, err
	}
	peerURL, err := freeURL()
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = "bench"
	cfg.Dir = dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded etcd not ready after 30s")
	}
	return &etcdServer{e: e, dir: dir, endpoint: clientURL.String()}, nil
}

func (s *etcdServer) close() {
	s.e.Close()
	os.RemoveAll(s.dir)
}

// freeURL returns an http URL on a loopback port nothing listens on.
func freeURL() (url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, err
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}, nil
}

func (s *etcdServer) client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   []string{s.endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
}

// etcdSystem runs members of etcd's concurrency.Election, each with its
// own client and session (a lease of LeaseTTL, kept alive every TTL/3 by
// the client).
type etcdSystem struct {
	srv    *etcdServer
	prefix string
	ttl    int // session TTL, whole seconds
	acq    chan acquisition

	mu      sync.Mutex
	members [slots]*etcdMember
	gen     int
}

type etcdMember struct {
	cli     *clientv3.Client
	sess    *concurrency.Session
	el      *concurrency.Election
	cancel  context.CancelFunc
	done    chan struct{} // the campaign returned
	leading atomic.Bool   // Campaign returned nil and Resign was not called
}

// isLeader is the cheapest local check etcd offers: Campaign returned and
// the session is alive. Session.Done closes when the client's keepalive
// stream ends or, at the latest, one deadline sweep (every second) after
// the last keepalive answer plus the TTL, on the client's clock; it is not
// bounded by the server's expiry, so a cut-off client may believe it leads
// for up to about one second after its lease expired on the server.
func (m *etcdMember) isLeader() bool {
	if !m.leading.Load() {
		return false
	}
	select {
	case <-m.sess.Done():
		return false
	default:
		return true
	}
}

func newEtcd(srv *etcdServer, prefix string, tm timings) *etcdSystem {
	return &etcdSystem{srv: srv, prefix: prefix, ttl: int(tm.ttl / time.Second), acq: make(chan acquisition, 256)}
}

func (s *etcdSystem) name() string                     { return "etcd" }
func (s *etcdSystem) size() int                        { return slots }
func (s *etcdSystem) acquisitions() <-chan acquisition { return s.acq }

// startEtcdMember connects, opens a session and campaigns; onLead runs
// when the campaign wins.
func startEtcdMember(srv *etcdServer, prefix, id string, ttl int, onLead func()) (*etcdMember, error) {
	cli, err := srv.client()
	if err != nil {
		return nil, err
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
	if err != nil {
		cli.Close()
		return nil, err
	}
	m := &etcdMember{cli: cli, sess: sess, el: concurrency.NewElection(sess, prefix), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() {
		defer close(m.done)
		if m.el.Campaign(ctx, id) == nil {
			m.leading.Store(true)
			if onLead != nil {
				onLead()
			}
		}
	}()
	return m, nil
}

func (s *etcdSystem) start(_ context.Context, slot int) error {
	s.mu.Lock()
	s.gen++
	id := fmt.Sprintf("etcd-%d-g%d", slot, s.gen)
	s.mu.Unlock()
	m, err := startEtcdMember(s.srv, s.prefix, id, s.ttl, func() { report(s.acq, slot, time.Now()) })
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.members[slot] = m
	s.mu.Unlock()
	return nil
}

func (s *etcdSystem) take(slot int) *etcdMember {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.members[slot]
	s.members[slot] = nil
	return m
}

func (s *etcdSystem) leads(slot int) bool {
	s.mu.Lock()
	m := s.members[slot]
	s.mu.Unlock()
	return m != nil && m.isLeader()
}

// release resigns, which deletes the leader's key: the next candidate's
// watch sees the delete. The member then leaves (its session is revoked).
func (s *etcdSystem) release(ctx context.Context, slot int) (bool, error) {
	m := s.take(slot)
	if m == nil {
		return true, errEmptySlot
	}
	m.leading.Store(false)
	err := m.el.Resign(ctx)
	m.close()
	return true, err
}

// crash closes the client without resigning or revoking: the key stays
// until the server expires the session's lease.
func (s *etcdSystem) crash(_ context.Context, slot int) error {
	m := s.take(slot)
	if m == nil {
		return errEmptySlot
	}
	m.cancel()
	err := m.cli.Close()
	<-m.done
	return err
}

func (m *etcdMember) close() {
	m.cancel()
	<-m.done
	m.sess.Close() // revokes the lease
	m.cli.Close()
}

func (s *etcdSystem) stop(_ context.Context, slot int) {
	if m := s.take(slot); m != nil {
		m.close()
	}
}

func (s *etcdSystem) close(ctx context.Context) error {
	for slot := range slots {
		s.stop(ctx, slot)
	}
	return nil
}
