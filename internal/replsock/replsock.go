// Package replsock is the socket of a logical replication connection that
// reads in batches: after a read that took everything the socket held, the
// next waits for the stream to gather (see Conn). The relay reads its
// stream through it, and ferrybench's walsender bound reads the same way,
// so that the bound is the walsender's and not its client's.
package replsock

import (
	"context"
	"crypto/tls"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/internal/rawsock"
)

// Dial wraps dial: the connection's socket calls read (when not nil) for
// each read that brought data and, with a window, lets the stream gather
// after a read that emptied it (see Conn). It lies beneath TLS when the
// connection has it: both are about the socket's reads.
func Dial(dial pgconn.DialFunc, window time.Duration, read func()) pgconn.DialFunc {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn := &Conn{Conn: rawsock.Wrap(c), read: read, window: max(window, 0)}
		if window > 0 {
			conn.timer, _ = rawsock.NewTimer() // without one, time.Sleep
		}
		if sc, ok := c.(syscall.Conn); ok && window > 0 {
			if raw, err := sc.SyscallConn(); err == nil {
				conn.raw = raw
				if n := receiveBuffer(c.RemoteAddr()); n > 0 {
					_ = raw.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, n) })
				}
			}
		}
		return conn, nil
	}
}

// receiveBuffer is the receive buffer (SO_RCVBUF) a replication socket to
// addr gets, 0 to leave the kernel's: loopbackRcvBuf to a walsender on the
// same host. Over loopback the kernel delivers each of the walsender's
// sends to the relay's socket in the walsender's own send, with the TCP
// receive work, while the window is open: a relay that keeps up with the
// walsender keeps it paying that once per message (a one-event-per-
// transaction backlog decoded at 6-7 µs per event instead of 3.7, a drain
// that settles at the slower rate in half the runs). With a small buffer
// the window closes while the relay is busy with a read, the sends gather
// in the walsender's own queue and go over together. A remote walsender's
// sends do not do the relay's receive work, and a small window would bound
// the drain to it by the round trip: the kernel's autotuning stays.
func receiveBuffer(addr net.Addr) int {
	if a, ok := addr.(*net.TCPAddr); ok && a.IP.IsLoopback() {
		return loopbackRcvBuf
	}
	return 0
}

// Conn is a replication connection's socket. One goroutine
// reads it at a time; pgconn may set its deadline from another (a
// cancelled context), hence the atomic.
//
// At low rates the walsender sends each transaction's messages as it
// decodes them, and a relay that reads whatever arrived wakes for each
// one: a read, a decode, a produce request and the Go runtime's own
// wake-ups, per event. After a read that took everything the socket held
// (it did not fill the buffer), the next read waits, up to the read
// deadline, for as long as the stream took, at the rate it came since the
// socket was last emptied, to bring gatherBytes, and at most window: at
// low rates the window (the transactions that arrive meanwhile are read,
// decoded and published together), during a backlog a fraction of a
// millisecond or nothing, so that what gathers stays below what the
// socket's buffer holds. A read that fills the buffer is followed at once.
//
// While it waits, the socket does not signal what arrives (its receive
// low-water mark, SO_RCVLOWAT, is raised; TCP only): otherwise each of the
// walsender's sends would wake the process's network poller, which has
// nothing to do until the wait ends (at 1,000 events/s the relay's thread
// switches per event went from 4.9 to 3.0 without these wake-ups). What
// the walsender's sends cost it is receiveBuffer's part.
//
// The socket is read readSize bytes at a time into a buffer of the Conn's
// own, which the connection's reader (pgconn's, 8 KiB at a time) takes
// from: one system call per gathered batch, not per 8 KiB.
type Conn struct {
	net.Conn
	read     func()
	window   time.Duration
	wait     time.Duration // how long after emptied the next read waits
	emptied  time.Time     // when a read last took everything the socket held; zero after a full one
	since    time.Time     // when the socket was emptied before, for the rate
	gathered int           // bytes read since then
	deadline atomic.Int64  // the read deadline last set, in Unix nanoseconds; 0: none
	readAt   atomic.Int64  // when a read last brought data, in Unix nanoseconds; 0: never
	buf      []byte        // read from the socket, not yet taken: buf[next:filled]
	next     int
	filled   int
	raw      syscall.RawConn // the socket's descriptor, for its low-water mark; nil when it has none
	timer    *rawsock.Timer  // what the wait after an emptying read sleeps on; nil: time.Sleep
}

// gatherBytes is what a wait lets the stream bring at most, at its rate;
// minWait the shortest wait worth a timer; readSize what one read of the
// socket takes at most; quietLowat the low-water mark while a read waits;
// loopbackRcvBuf the receive buffer of a socket to the same host
// (receiveBuffer: 64 KiB left the walsender waiting on a client that
// discards what it reads, 256 KiB did not end the slow drains).
const (
	gatherBytes    = 32 << 10
	minWait        = 200 * time.Microsecond
	readSize       = 128 << 10
	quietLowat     = 1 << 20
	loopbackRcvBuf = 128 << 10
)

func (c *Conn) setDeadline(t time.Time) {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	c.deadline.Store(ns)
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	c.setDeadline(t)
	return c.Conn.SetReadDeadline(t)
}

func (c *Conn) SetDeadline(t time.Time) error {
	c.setDeadline(t)
	return c.Conn.SetDeadline(t)
}

// Of returns the Conn beneath c: c itself, or the socket of its TLS; nil
// when there is none.
func Of(c net.Conn) *Conn {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	rc, _ := c.(*Conn)
	return rc
}

// ReadAt is when the last read of the socket brought data: when everything
// it brought arrived (the zero Time before the first). A reader taking
// message after message from one read asks it instead of the clock.
func (c *Conn) ReadAt() time.Time {
	if ns := c.readAt.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// ReadDeadlineBy makes the read deadline t, or leaves the one set when it
// falls at most slack before t: a deadline somewhat early only ends a read
// sooner, and a reader that moves its deadline with every message (now plus
// a constant) then updates the runtime's timer once per slack, not per
// message. Concurrent SetDeadline and SetReadDeadline calls are seen.
func (c *Conn) ReadDeadlineBy(t time.Time, slack time.Duration) error {
	if set := c.deadline.Load(); set != 0 && !t.IsZero() {
		if early := t.UnixNano() - set; early >= 0 && early <= int64(slack) {
			return nil
		}
	}
	return c.SetReadDeadline(t)
}

func (c *Conn) Read(b []byte) (int, error) {
	if c.next < c.filled {
		n := copy(b, c.buf[c.next:c.filled])
		c.next += n
		return n, nil
	}
	if c.wait > 0 && !c.emptied.IsZero() {
		until := c.emptied.Add(c.wait)
		if ns := c.deadline.Load(); ns != 0 && ns < until.UnixNano() {
			until = time.Unix(0, ns)
		}
		if d := time.Until(until); d > 0 {
			c.lowat(quietLowat)
			c.sleep(d)
			c.lowat(1)
		}
	}
	if c.buf == nil {
		c.buf = make([]byte, readSize)
	}
	// Before the socket is read again, the goroutines that the last read's
	// messages made runnable (the producer's, sending what was decoded)
	// run: on one P the reader would otherwise keep it while the stream
	// flows, and they would send only when it stops (its in-flight window
	// full), while the walsender waits on a full socket.
	runtime.Gosched()
	n, err := c.Conn.Read(c.buf)
	if n > 0 {
		now := time.Now()
		c.readAt.Store(now.UnixNano())
		if c.read != nil {
			c.read()
		}
		c.gathered += n
		if n < len(c.buf) {
			c.emptied = now
			c.wait = c.nextWait(c.emptied)
			c.since, c.gathered = c.emptied, 0
		} else {
			c.emptied = time.Time{}
		}
		c.next, c.filled = copy(b, c.buf[:n]), n
	}
	return min(n, len(b)), err
}

// lowat sets the socket's receive low-water mark: below it, what arrives
// wakes no reader nor poller. Best effort: a socket that has none (a Unix
// socket ignores it) reads as before.
// sleep waits d on the connection's timer: one wake-up, when it is due (a
// Go timer's is two, the first early; see rawsock.Timer).
func (c *Conn) sleep(d time.Duration) {
	if c.timer == nil || c.timer.Sleep(d) != nil {
		time.Sleep(d)
	}
}

// Close closes the connection and its timer.
func (c *Conn) Close() error {
	if c.timer != nil {
		c.timer.Close()
	}
	return c.Conn.Close()
}

func (c *Conn) lowat(n int) {
	if c.raw == nil {
		return
	}
	_ = rawsock.Setsockopt(c.raw, syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
}

// nextWait is the wait after the socket was emptied at now: as long as the
// stream, at its rate since the socket was emptied before, takes to bring
// gatherBytes, at most window; none below minWait.
func (c *Conn) nextWait(now time.Time) time.Duration {
	if c.window <= 0 {
		return 0
	}
	wait := c.window
	if elapsed := now.Sub(c.since); !c.since.IsZero() && elapsed > 0 && c.gathered > 0 {
		wait = min(wait, time.Duration(float64(elapsed)*gatherBytes/float64(c.gathered)))
	}
	if wait < minWait {
		return 0
	}
	return wait
}
