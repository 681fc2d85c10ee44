package natsputex_test

import (
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// triggerProxy is a TCP proxy that, once armed, watches what its clients
// send for pattern (such as "PUB $KV.bucket.key "): from the chunk that
// holds it on, the connection's replies are dropped, and after dropFor
// both sides are closed (the client reconnects). The write reaches the
// server; its answer is lost, exactly for that write.
type triggerProxy struct {
	t        *testing.T
	ln       net.Listener
	upstream string
	pattern  []byte
	dropFor  time.Duration
	armed    atomic.Bool
	fired    chan time.Time
	mu       sync.Mutex
	conns    []net.Conn
}

func newTriggerProxy(t *testing.T, upstream, pattern string, dropFor time.Duration) *triggerProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &triggerProxy{t: t, ln: ln, upstream: upstream, pattern: []byte(pattern), dropFor: dropFor, fired: make(chan time.Time, 16)}
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

func (p *triggerProxy) Addr() string { return p.ln.Addr().String() }

func (p *triggerProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		var dropping atomic.Bool
		closeBoth := func() { _ = c.Close(); _ = u.Close() }
		go func() { // client to server
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if _, werr := u.Write(buf[:n]); werr != nil {
						closeBoth()
						return
					}
					if p.armed.Load() && !dropping.Load() && bytes.Contains(buf[:n], p.pattern) {
						p.armed.Store(false)
						dropping.Store(true)
						p.fired <- time.Now()
						time.AfterFunc(p.dropFor, closeBoth)
					}
				}
				if err != nil {
					closeBoth()
					return
				}
			}
		}()
		go func() { // server to client
			buf := make([]byte, 64<<10)
			for {
				n, err := u.Read(buf)
				if n > 0 && !dropping.Load() {
					if _, werr := c.Write(buf[:n]); werr != nil {
						closeBoth()
						return
					}
				}
				if err != nil {
					if err != io.EOF {
						closeBoth()
					}
					closeBoth()
					return
				}
			}
		}()
	}
}
