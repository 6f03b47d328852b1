package testdb

import (
	"io"
	"net"
	"sync"
	"testing"
)

// A Proxy forwards TCP connections to a database server and can be made to
// stop answering: while blocked, bytes in both directions are held back and
// connections stay open, as when a network partition or a stalled server
// leaves a client waiting.
type Proxy struct {
	Addr   string // the address to connect to instead of the server
	target string
	ln     net.Listener

	mu      sync.Mutex
	blocked bool
	closed  bool
	cond    *sync.Cond
	conns   []net.Conn
	wg      sync.WaitGroup
}

// NewProxy starts a proxy to target, closed when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Block stops forwarding. Connections stay open; nothing gets through.
func (p *Proxy) Block() {
	p.mu.Lock()
	p.blocked = true
	p.mu.Unlock()
}

// Unblock resumes forwarding.
func (p *Proxy) Unblock() {
	p.mu.Lock()
	p.blocked = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.blocked = false
	p.cond.Broadcast()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			// Accepted while Close ran: Close did not see it to close it.
			p.mu.Unlock()
			in.Close()
			out.Close()
			return
		}
		p.conns = append(p.conns, in, out)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(out, in)
		go p.pipe(in, out)
	}
}

// pipe copies src to dst, waiting while the proxy is blocked.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.blocked {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}
