package main

import (
	"io"
	"net"
	"testing"
	"time"
)

// echoServer accepts connections and echoes what they send.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends b and waits up to d for it to come back.
func roundTrip(c net.Conn, b string, d time.Duration) (string, error) {
	if _, err := c.Write([]byte(b)); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, len(b))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func TestProxyFaults(t *testing.T) {
	p, err := newProxy(echoServer(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "a", time.Second); err != nil || got != "a" {
		t.Fatalf("healthy: %q, %v", got, err)
	}
	if n := len(p.serverPorts()); n != 1 {
		t.Errorf("serverPorts: %d connections, want 1", n)
	}

	p.blackhole(false, true) // replies held back
	if _, err := roundTrip(c, "b", 200*time.Millisecond); err == nil {
		t.Fatal("a reply came back through a blackhole")
	}
	p.heal()
	c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 1)
	if _, err := io.ReadFull(c, buf); err != nil || buf[0] != 'b' {
		t.Fatalf("held reply after heal: %q, %v", buf, err)
	}

	p.slow(150*time.Millisecond, 0)
	start := time.Now()
	if _, err := roundTrip(c, "c", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if rt := time.Since(start); rt < 300*time.Millisecond {
		t.Errorf("round trip with 150ms each way took %v", rt)
	}
	p.heal()

	if n := p.reset(); n != 1 {
		t.Errorf("reset %d connections, want 1", n)
	}
	if _, err := roundTrip(c, "d", time.Second); err == nil {
		t.Error("a reset connection still works")
	}
}
