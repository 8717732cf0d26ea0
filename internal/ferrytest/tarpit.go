package ferrytest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Tarpit is a TCP address that takes connections and never answers, as a
// broker whose process hangs or a path that drops every reply: what a client
// writes is read and thrown away, and its requests wait for their own
// timeouts. A Kafka client given it as a seed broker learns nothing, and
// each of its calls takes as long as the client lets it. After Open, new
// connections are forwarded to target (a Kafka client then learns the
// cluster's own addresses and talks to them directly); Shut makes it silent
// again and closes every connection taken so far.
type Tarpit struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	open  bool
	conns []net.Conn
}

// NewTarpit listens on a loopback port, silent until Open, until the test
// ends.
func NewTarpit(t testing.TB, target string) *Tarpit {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("tarpit: %v", err)
	}
	p := &Tarpit{ln: ln, target: target}
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.Shut()
	})
	return p
}

// Addr is the address to dial.
func (p *Tarpit) Addr() string { return p.ln.Addr().String() }

// Open forwards the connections taken from now on to the target.
func (p *Tarpit) Open() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = true
}

// Shut silences the connections taken from now on, and closes every one
// taken so far, forwarded or not.
func (p *Tarpit) Shut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = false
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func (p *Tarpit) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		open := p.open
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		if !open {
			go func() { _, _ = io.Copy(io.Discard, c) }()
			continue
		}
		go p.forward(c)
	}
}

func (p *Tarpit) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, up)
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
	_, _ = io.Copy(c, up)
	_ = c.Close()
}
