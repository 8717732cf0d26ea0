package replsock

import (
	"bytes"
	"context"
	"net"
	"syscall"
	"testing"
	"time"
)

// The wait after an emptied socket is the window at low rates, and at
// higher ones the time the stream takes to bring gatherBytes: what gathers
// stays far below a socket's buffer, and a fast backlog does not wait.
func TestReadWaitFollowsTheStreamsRate(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, c := range []struct {
		name     string
		gathered int
		elapsed  time.Duration
		want     time.Duration
	}{
		{"1,000 events/s of 400 bytes", 2_000, 5 * time.Millisecond, 5 * time.Millisecond},
		{"the first emptying", 0, 0, 5 * time.Millisecond},
		{"8 MB/s", 40_000, 5 * time.Millisecond, time.Duration(float64(5*time.Millisecond) * gatherBytes / 40_000)},
		{"a 50 MB/s backlog: a fraction of a millisecond", 8 << 10, 160 * time.Microsecond, 640 * time.Microsecond},
		{"500 MB/s: no wait", 8 << 10, 16 * time.Microsecond, 0},
	} {
		s := &Conn{window: 5 * time.Millisecond, gathered: c.gathered}
		if c.elapsed > 0 {
			s.since = now.Add(-c.elapsed)
		}
		if got := s.nextWait(now); got != c.want {
			t.Errorf("%s: wait %s, want %s", c.name, got, c.want)
		}
	}
	if got := (&Conn{}).nextWait(now); got != 0 {
		t.Errorf("no window: wait %s, want none", got)
	}
}

// A burst the socket holds at once is read from it in one system call,
// however small the reads the connection's reader makes (pgconn's are 8
// KiB), and every byte comes through in order.
func TestABurstIsOneSocketRead(t *testing.T) {
	t.Parallel()
	ln := listen(t)
	burst := make([]byte, 100<<10)
	for i := range burst {
		burst[i] = byte(i * 7)
	}
	sent := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err == nil {
			_, err = s.Write(burst)
			defer s.Close()
		}
		sent <- err
		time.Sleep(time.Second) // the client reads before the close
	}()
	reads := 0
	c, err := Dial(nil, 5*time.Millisecond, func() { reads++ })(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the burst is in the socket's buffer
	var got []byte
	b := make([]byte, 8<<10)
	for len(got) < len(burst) {
		n, err := c.Read(b)
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
		got = append(got, b[:n]...)
	}
	if !bytes.Equal(got, burst) {
		t.Fatal("the bytes read are not the bytes sent")
	}
	if reads != 1 {
		t.Errorf("%d reads of the socket for a %d-byte burst it held, want 1", reads, len(burst))
	}
}

// The low-water mark a waiting read raises is the socket's, and it comes
// back to 1.
func TestLowatIsTheSockets(t *testing.T) {
	t.Parallel()
	ln := listen(t)
	go func() {
		if s, err := ln.Accept(); err == nil {
			defer s.Close()
			time.Sleep(time.Second)
		}
	}()
	nc, err := Dial(nil, 5*time.Millisecond, nil)(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := nc.(*Conn)
	get := func() int { return sockopt(t, c, syscall.SO_RCVLOWAT) }
	c.lowat(quietLowat)
	if v := get(); v < 64<<10 {
		t.Errorf("SO_RCVLOWAT %d while quiet, want it raised (asked %d)", v, quietLowat)
	}
	c.lowat(1)
	if v := get(); v != 1 {
		t.Errorf("SO_RCVLOWAT %d after, want 1", v)
	}
}

// A socket to a walsender on the same host gets the small receive buffer
// (the kernel doubles what it is given, for its bookkeeping); one to
// another host keeps the kernel's autotuned buffer, as does a connection
// read without a window.
func TestALoopbackSocketGetsTheSmallReceiveBuffer(t *testing.T) {
	t.Parallel()
	if n := receiveBuffer(&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 5432}); n != 0 {
		t.Errorf("a remote walsender's socket: receive buffer %d, want the kernel's (0)", n)
	}
	if n := receiveBuffer(&net.UnixAddr{Name: "/run/postgresql/.s.PGSQL.5432", Net: "unix"}); n != 0 {
		t.Errorf("a Unix socket: receive buffer %d, want the kernel's (0)", n)
	}
	ln := listen(t)
	go func() {
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			defer s.Close()
		}
	}()
	rcvbuf := func(window time.Duration) int {
		nc, err := Dial(nil, window, nil)(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		return sockopt(t, nc.(*Conn), syscall.SO_RCVBUF)
	}
	if got := rcvbuf(5 * time.Millisecond); got != 2*loopbackRcvBuf {
		t.Errorf("loopback socket read with a window: SO_RCVBUF %d, want %d", got, 2*loopbackRcvBuf)
	}
	if got := rcvbuf(0); got == 2*loopbackRcvBuf {
		t.Errorf("loopback socket read without a window: SO_RCVBUF %d, want the kernel's", got)
	}
}

// listen is a loopback listener, closed when the test ends.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// sockopt reads an int socket option of c's socket.
func sockopt(t *testing.T, c *Conn, opt int) int {
	t.Helper()
	raw, err := c.Conn.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := raw.Control(func(fd uintptr) { v, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, opt) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	return v
}
