package ferrytest

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
)

// Blackhole is a Kafka dialer (pass Dial to kgo.Dialer) whose connections
// can be silenced, as behind a network partition that drops packets: after
// Cut, every connection dialled so far swallows what is written to it and
// never answers again, and new connections are refused until Restore. A
// request written to a silenced connection stays in flight, unanswered,
// until the client's own timeout or Close. Restore lets new connections
// through; silenced ones stay silent.
type Blackhole struct {
	mu    sync.Mutex
	cut   bool
	conns []*silenceableConn
}

// Dial dials host unless the hole is cut.
func (b *Blackhole) Dial(ctx context.Context, network, host string) (net.Conn, error) {
	b.mu.Lock()
	cut := b.cut
	b.mu.Unlock()
	if cut {
		return nil, errors.New("blackhole: network cut")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	sc := &silenceableConn{Conn: c}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cut {
		sc.silenced.Store(true)
	}
	b.conns = append(b.conns, sc)
	return sc, nil
}

// Cut silences every connection and refuses new ones.
func (b *Blackhole) Cut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cut = true
	for _, c := range b.conns {
		c.silenced.Store(true)
	}
	b.conns = nil
}

// Restore lets new connections through again.
func (b *Blackhole) Restore() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cut = false
}

type silenceableConn struct {
	net.Conn
	silenced atomic.Bool
}

// Write drops p on a silenced connection and reports it written, as a
// kernel does with a packet a partition later loses.
func (c *silenceableConn) Write(p []byte) (int, error) {
	if c.silenced.Load() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}
