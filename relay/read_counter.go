package relay

import (
	"context"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
)

// countReads wraps dial so that every read of the connection's socket that
// returns data counts on reads (ferry_relay_replication_reads_total).
// Beneath TLS when the connection has it: the count is of the socket's reads.
func countReads(dial pgconn.DialFunc, reads prometheus.Counter) pgconn.DialFunc {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &readCounter{Conn: c, reads: reads}, nil
	}
}

type readCounter struct {
	net.Conn
	reads prometheus.Counter
}

func (c *readCounter) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.reads.Inc()
	}
	return n, err
}
