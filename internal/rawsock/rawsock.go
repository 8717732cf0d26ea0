// Package rawsock is a TCP connection whose reads and writes are raw system
// calls on its non-blocking socket, for processes that sleep between short
// bursts of work, as the relay does at low rates.
//
// A Go program that makes a system call the ordinary way (syscall.Read,
// what the net package does) tells the scheduler it entered one; if the
// runtime's monitor thread (sysmon) was asleep because every P was idle,
// that call wakes it, and the monitor then looks again every 20 µs for as
// long as any P runs, in case the call blocks and its P must be handed to
// another thread. A process that wakes a few hundred times a second for a
// fraction of a millisecond pays for each of those wake-ups and sleeps: at
// 1,000 events/s they were about a quarter of the relay's CPU (perf: the
// monitor's nanosleep and futex switches). A read or write of a
// non-blocking socket never blocks, so it needs no such watch: made as a
// raw call, it leaves the monitor asleep. When the socket has nothing to
// read or no room to write, the call returns EAGAIN and the connection
// waits in the network poller as the net package's own would, with its
// deadlines.
package rawsock

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// Conn is a net.Conn whose Read and Write are raw system calls on its
// socket; everything else is the wrapped connection's.
type Conn struct {
	net.Conn
	raw syscall.RawConn
}

// Wrap returns c reading and writing through raw system calls, or c itself
// when it has no socket to make them on (it is not a syscall.Conn).
func Wrap(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{Conn: c, raw: raw}
}

// SyscallConn is the socket's, for its options.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.raw, nil }

// Read reads what the socket holds, waiting in the poller (up to the read
// deadline) while it holds nothing.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // wait in the poller
			}
			n, errno = int(r), e
			return true
		}
	})
	if err == nil && errno != 0 {
		err = errno
	}
	if err != nil {
		return 0, c.opError("read", err)
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of b, waiting in the poller (up to the write deadline)
// while the socket's buffer is full. MSG_NOSIGNAL: a peer that closed the
// connection is an EPIPE error, not a signal.
func (c *Conn) Write(b []byte) (int, error) {
	var n int
	var errno syscall.Errno
	err := c.raw.Write(func(fd uintptr) bool {
		for n < len(b) {
			r, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&b[n])), uintptr(len(b)-n), syscall.MSG_NOSIGNAL, 0, 0)
			switch e {
			case 0:
				if r == 0 {
					errno = syscall.EIO // no progress and no error: do not spin
					return true
				}
				n += int(r)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // wait in the poller for room
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err == nil && errno != 0 {
		err = errno
	}
	if err != nil {
		return n, c.opError("write", err)
	}
	return n, nil
}

// opError wraps err as the net package does, so that callers that look
// for a timeout (net.Error) or a closed connection see the same errors.
func (c *Conn) opError(op string, err error) error {
	if errno, ok := err.(syscall.Errno); ok {
		err = os.NewSyscallError(op, errno)
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// Setsockopt sets an integer socket option as a raw system call (see the
// package's doc): for an option set on every wake-up.
func Setsockopt(raw syscall.RawConn, level, opt, value int) error {
	var errno syscall.Errno
	err := raw.Control(func(fd uintptr) {
		v := int32(value)
		_, _, errno = syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, fd, uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&v)), unsafe.Sizeof(v), 0)
	})
	if err == nil && errno != 0 {
		err = errno
	}
	return err
}

// DialFunc is the shape of net.Dialer.DialContext, kgo.Dialer's argument.
type DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// Dialer dials within the given timeout (none when 0), the TLS handshake
// included, and wraps the connection; with tlsConfig, TLS runs above the wrapped socket
// (its ServerName, when empty, is the address's host), as franz-go's
// kgo.DialTLSConfig would dial it.
func Dialer(timeout time.Duration, tlsConfig *tls.Config) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if timeout > 0 {
			// One bound for the dial and the handshake, as tls.Dialer's.
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c = Wrap(c)
		if tlsConfig == nil {
			return c, nil
		}
		tc := tlsConfig.Clone()
		if tc.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				c.Close()
				return nil, err
			}
			tc.ServerName = host
		}
		t := tls.Client(c, tc)
		if err := t.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		return t, nil
	}
}
