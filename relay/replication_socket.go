package relay

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
)

// replicationDial wraps dial: the replication connection's socket counts
// its reads (ferry_relay_replication_reads_total) and, with a read window,
// lets the stream gather after a read that emptied it (Config.ReadWindow).
// It lies beneath TLS when the connection has it: both are about the
// socket's reads.
func replicationDial(dial pgconn.DialFunc, window time.Duration, reads prometheus.Counter) pgconn.DialFunc {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &replicationSocket{Conn: c, reads: reads, window: max(window, 0)}, nil
	}
}

// replicationSocket is the replication connection's socket. One goroutine
// reads it at a time; pgconn may set its deadline from another (a
// cancelled context), hence the atomic.
//
// At low rates the walsender sends each transaction's messages as it
// decodes them, and a relay that reads whatever arrived wakes for each
// one: a read, a decode, a produce request and the Go runtime's own
// wake-ups, per event. After a read that took everything the socket held
// (it did not fill the buffer), the next read waits until window has
// passed since that read, or the read deadline, whichever comes first: the
// transactions that arrive meanwhile are read, decoded and published
// together. A read that fills the buffer (a backlog) is followed at once,
// so a drain never waits.
type replicationSocket struct {
	net.Conn
	reads    prometheus.Counter
	window   time.Duration
	emptied  time.Time    // when a read last took everything the socket held; zero after a full one
	deadline atomic.Int64 // the read deadline last set, in Unix nanoseconds; 0: none
}

func (c *replicationSocket) setDeadline(t time.Time) {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	c.deadline.Store(ns)
}

func (c *replicationSocket) SetReadDeadline(t time.Time) error {
	c.setDeadline(t)
	return c.Conn.SetReadDeadline(t)
}

func (c *replicationSocket) SetDeadline(t time.Time) error {
	c.setDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *replicationSocket) Read(b []byte) (int, error) {
	if c.window > 0 && !c.emptied.IsZero() {
		until := c.emptied.Add(c.window)
		if ns := c.deadline.Load(); ns != 0 && ns < until.UnixNano() {
			until = time.Unix(0, ns)
		}
		if d := time.Until(until); d > 0 {
			time.Sleep(d)
		}
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.reads.Inc()
		if n < len(b) {
			c.emptied = time.Now()
		} else {
			c.emptied = time.Time{}
		}
	}
	return n, err
}
