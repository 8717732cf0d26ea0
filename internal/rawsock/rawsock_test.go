package rawsock

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"runtime/trace"
	"testing"
	"time"

	xtrace "golang.org/x/exp/trace"
)

// pair is a loopback TCP connection: the wrapped client end and the
// server's plain end.
func pair(t *testing.T) (client net.Conn, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			s = nil
		}
		accepted <- s
	}()
	c, err := Dialer(time.Second, nil)(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	if _, ok := c.(*Conn); !ok {
		t.Fatalf("Dialer returned %T, want *rawsock.Conn", c)
	}
	return c, s
}

// Reads and writes through the raw calls carry every byte in order both
// ways, including a write far larger than the socket's buffers (it waits in
// the poller for room), and a closed peer reads as io.EOF.
func TestBytesCrossInOrderBothWays(t *testing.T) {
	t.Parallel()
	c, s := pair(t)
	big := make([]byte, 8<<20)
	_, _ = rand.Read(big)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(s, int64(len(big))))
		got <- b
	}()
	if n, err := c.Write(big); err != nil || n != len(big) {
		t.Fatalf("write: %d of %d bytes, %v", n, len(big), err)
	}
	if b := <-got; !bytes.Equal(b, big) {
		t.Fatalf("the server read %d bytes, not the %d written in order", len(b), len(big))
	}

	back := []byte("the other way")
	if _, err := s.Write(back); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := io.ReadAtLeast(c, buf, len(back))
	if err != nil || !bytes.Equal(buf[:n], back) {
		t.Fatalf("read %q, %v; want %q", buf[:n], err, back)
	}
	s.Close()
	if n, err := c.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("after the peer closed: %d bytes, %v; want io.EOF", n, err)
	}
}

// A read deadline ends a read that has nothing to read with the error the
// net package gives (pgconn and franz-go tell a timeout by it); a write to
// a peer that reset the connection fails, and does not kill the process
// with SIGPIPE.
func TestDeadlinesAndBrokenPeersFailAsTheNetPackages(t *testing.T) {
	t.Parallel()
	c, s := pair(t)
	if err := c.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := c.Read(make([]byte, 16))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v (%T), want a net.Error that is a timeout", err, err)
	}

	s.(*net.TCPConn).SetLinger(0) // close with a reset
	s.Close()
	var werr error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if _, werr = c.Write([]byte("after the reset")); werr != nil {
			break
		}
	}
	var op *net.OpError
	if !errors.As(werr, &op) || op.Op != "write" {
		t.Fatalf("write to a reset connection: %v, want a *net.OpError of op write", werr)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v, want net.ErrClosed", err)
	}
}

// What the package is for: a read and a write through Conn enter no system
// call the Go scheduler sees (in a runtime trace, the goroutine never goes
// to the syscall state), so they cannot wake the runtime's monitor thread.
// The same read and write through the plain connection do, which shows the
// trace sees them.
func TestReadsAndWritesEnterNoSchedulerSystemCall(t *testing.T) {
	// Not parallel: the runtime trace is the process's.
	c, s := pair(t)
	plain := c.(*Conn).Conn
	msg := []byte("ping")
	for _, tc := range []struct {
		name    string
		conn    net.Conn
		wantAny bool
	}{
		{"rawsock.Conn", c, false},
		{"the plain connection (control)", plain, true},
	} {
		var out bytes.Buffer
		if err := trace.Start(&out); err != nil {
			t.Fatal(err)
		}
		// The connection's goroutine writes, then reads the answer once
		// it has arrived (so that the read finds it and does not wait in
		// the poller); the server's end is this goroutine's.
		answered, done := make(chan struct{}), make(chan error, 1)
		go func() {
			trace.Log(context.Background(), "rawsock", "conn goroutine")
			if _, err := tc.conn.Write(msg); err != nil {
				done <- err
				return
			}
			<-answered
			_, err := io.ReadFull(tc.conn, make([]byte, len(msg)))
			done <- err
		}()
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(s, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write(msg); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		close(answered)
		err := <-done
		trace.Stop()
		if err != nil {
			t.Fatal(err)
		}
		n := syscallsOfConnGoroutine(t, &out)
		if tc.wantAny && n < 2 {
			t.Errorf("%s: %d scheduler-visible system calls in the round trip, want at least its write and read", tc.name, n)
		}
		if !tc.wantAny && n != 0 {
			t.Errorf("%s: %d scheduler-visible system calls in the round trip, want none", tc.name, n)
		}
	}
}

// syscallsOfConnGoroutine counts, in a runtime trace, the transitions to
// the syscall state of the goroutine that logged the marker, after it did;
// the server's goroutine is the test's own and is not counted.
func syscallsOfConnGoroutine(t *testing.T, r io.Reader) int {
	t.Helper()
	var g xtrace.GoID = xtrace.NoGoroutine
	n := 0
	eachTraceEvent(t, r, func(ev xtrace.Event) {
		switch ev.Kind() {
		case xtrace.EventLog:
			if l := ev.Log(); l.Category == "rawsock" && l.Message == "conn goroutine" {
				g = ev.Goroutine()
			}
		case xtrace.EventStateTransition:
			st := ev.StateTransition()
			if g == xtrace.NoGoroutine || st.Resource.Kind != xtrace.ResourceGoroutine || st.Resource.Goroutine() != g {
				return
			}
			if _, to := st.Goroutine(); to == xtrace.GoSyscall {
				n++
			}
		}
	})
	if g == xtrace.NoGoroutine {
		t.Fatal("the trace has no marker of the connection's goroutine")
	}
	return n
}

// eachTraceEvent calls fn with each event of the runtime trace r.
func eachTraceEvent(t *testing.T, r io.Reader, fn func(xtrace.Event)) {
	t.Helper()
	tr, err := xtrace.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := tr.ReadEvent()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(ev)
	}
}

// TLS dialed by Dialer runs above the raw socket: a handshake against a
// server with a certificate for 127.0.0.1 (ServerName taken from the
// address), and bytes both ways through it.
func TestDialerRunsTLSAboveTheRawSocket(t *testing.T) {
	t.Parallel()
	cert, pool := selfSigned(t)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer s.Close()
				_, _ = io.Copy(s, s) // echo; a failed handshake ends it
			}()
		}
	}()
	// The address's host is an IP: the certificate names it as an IP SAN.
	c, err := Dialer(time.Second, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial with TLS: %v", err)
	}
	defer c.Close()
	tc, ok := c.(*tls.Conn)
	if !ok {
		t.Fatalf("Dialer with TLS returned %T, want *tls.Conn", c)
	}
	if _, ok := tc.NetConn().(*Conn); !ok {
		t.Fatalf("TLS runs above %T, want *rawsock.Conn", tc.NetConn())
	}
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo through TLS: %q, %v", buf, err)
	}

	// A certificate the client does not trust fails the dial.
	_, err = Dialer(time.Second, &tls.Config{MinVersion: tls.VersionTLS12})(context.Background(), "tcp", ln.Addr().String())
	if err == nil {
		t.Fatal("dial trusting no CA succeeded")
	}
}

func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "rawsock test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}
