package main

import (
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// A proxy forwards one node's TCP connections to the database server and
// injects the network faults of the nemesis: a blackhole in either or both
// directions (bytes are held back, connections stay open, and what was held
// is delivered after the heal, as TCP retransmission would), added latency
// with jitter, and connection resets.
type proxy struct {
	addr   string
	target string
	ln     net.Listener

	mu        sync.Mutex
	cond      *sync.Cond
	blockUp   bool // client to server
	blockDown bool // server to client
	delay     time.Duration
	jitter    time.Duration
	rng       *rand.Rand
	links     map[*link]struct{}
	closed    bool
	wg        sync.WaitGroup
	accepting sync.WaitGroup
}

// A link is one client connection and its connection to the server.
type link struct {
	client, server *net.TCPConn
}

func newProxy(target string, seed uint64) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{addr: ln.Addr().String(), target: target, ln: ln,
		links: map[*link]struct{}{}, rng: rand.New(rand.NewPCG(seed, 0x70c5))}
	p.cond = sync.NewCond(&p.mu)
	p.accepting.Add(1)
	go p.accept()
	return p, nil
}

// blackhole holds back the bytes of the chosen directions until heal.
func (p *proxy) blackhole(up, down bool) {
	p.mu.Lock()
	p.blockUp, p.blockDown = up, down
	p.mu.Unlock()
}

// slow delays every chunk by delay, plus or minus up to jitter.
func (p *proxy) slow(delay, jitter time.Duration) {
	p.mu.Lock()
	p.delay, p.jitter = delay, jitter
	p.mu.Unlock()
}

// heal ends blackholes and latency.
func (p *proxy) heal() {
	p.mu.Lock()
	p.blockUp, p.blockDown = false, false
	p.delay, p.jitter = 0, 0
	p.cond.Broadcast()
	p.mu.Unlock()
}

// reset closes every connection with a TCP RST on both sides.
func (p *proxy) reset() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		l.client.SetLinger(0)
		l.server.SetLinger(0)
		l.client.Close()
		l.server.Close()
		delete(p.links, l)
		n++
	}
	return n
}

// serverPorts returns the local ports of the proxy's connections to the
// server: the client ports the server sees, which identify this node's
// sessions on the server.
func (p *proxy) serverPorts() map[int]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	ports := map[int]bool{}
	for l := range p.links {
		if a, ok := l.server.LocalAddr().(*net.TCPAddr); ok {
			ports[a.Port] = true
		}
	}
	return ports
}

func (p *proxy) close() {
	p.ln.Close()
	p.accepting.Wait()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.heal()
	p.reset()
	p.wg.Wait()
}

func (p *proxy) accept() {
	defer p.accepting.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c.(*net.TCPConn), server: s.(*net.TCPConn)}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.links[l] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(l, l.server, l.client, true)
		go p.pipe(l, l.client, l.server, false)
	}
}

// pipe copies src to dst, holding chunks while their direction is
// blackholed and delaying them by the current latency.
func (p *proxy) pipe(l *link, dst, src *net.TCPConn, up bool) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		dst.Close()
		src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for !p.closed && ((up && p.blockUp) || (!up && p.blockDown)) {
				p.cond.Wait()
			}
			d := p.delay
			if p.jitter > 0 {
				d += time.Duration(p.rng.Int64N(int64(2*p.jitter))) - p.jitter
			}
			p.mu.Unlock()
			if d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
