package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// serve starts s until the test ends.
func serve(t *testing.T, s *HTTPServer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// closedByServer reads conn to its end and reports whether the server
// closed it before the deadline, which stands for "indefinitely".
func closedByServer(conn net.Conn, deadline time.Duration) error {
	_ = conn.SetReadDeadline(time.Now().Add(deadline))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("still open after %s", deadline)
	}
	return nil // EOF or a reset: the server let go
}

// A slow body or an idle keep-alive connection does not hold the probe
// server's connection indefinitely: it has read, write and idle timeouts.
// The behaviour is checked with the server's own timeouts divided by 50, so
// that the test need not wait a minute.
func TestHTTPServerDropsSlowAndIdleConnections(t *testing.T) {
	t.Parallel()
	s, err := NewHTTPServer("127.0.0.1:0", prometheus.NewRegistry(), Probes{})
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]time.Duration{"ReadHeaderTimeout": s.srv.ReadHeaderTimeout, "ReadTimeout": s.srv.ReadTimeout,
		"WriteTimeout": s.srv.WriteTimeout, "IdleTimeout": s.srv.IdleTimeout} {
		if d <= 0 || d > 2*time.Minute {
			t.Errorf("%s is %s, want a timeout of at most 2m", name, d)
		}
	}
	s.srv.ReadHeaderTimeout /= 50
	s.srv.ReadTimeout /= 50
	s.srv.WriteTimeout /= 50
	s.srv.IdleTimeout /= 50
	serve(t, s)
	// Far longer than any scaled timeout: a connection still open then
	// would be open for good.
	const forever = 20 * time.Second

	idle, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	fmt.Fprintf(idle, "GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("keep-alive request: %v %v", resp, err)
	}
	resp.Body.Close()
	if err := closedByServer(idle, forever); err != nil {
		t.Errorf("idle keep-alive connection: %v", err)
	}

	slow, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprintf(slow, "GET /healthz HTTP/1.1\r\nHost: probe\r\nContent-Length: 1000\r\n\r\nten bytes.")
	if err := closedByServer(slow, forever); err != nil {
		t.Errorf("request whose body never comes: %v", err)
	}
}

// /healthz and /readyz say why they fail without showing the database's
// user, name or address, which a failed connection's error carries: the
// server listens on every interface of the pod.
func TestProbeBodiesNeverShowTheDatabase(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	_, connErr := pgx.Connect(context.Background(), "postgres://hidden_user:pw@"+closed+"/hidden_db?connect_timeout=5")
	if connErr == nil {
		t.Fatal("connected to a closed port")
	}
	host, _, _ := net.SplitHostPort(closed)
	wrapped := func() error { return fmt.Errorf("relay cannot reach PostgreSQL: %w", connErr) }
	// An error flattened to text by the way (%v) is no longer a
	// *pgconn.ConnectError: the names of --database-url hide it.
	flattened := func() error { return fmt.Errorf("relay cannot reach PostgreSQL: %v", connErr) }
	db := Database{URL: "postgres://hidden_user:pw@" + closed + "/hidden_db"}
	for _, probes := range []Probes{
		{Healthy: wrapped, Ready: wrapped},
		{Healthy: flattened, Ready: flattened, Hide: db.Names()},
	} {
		s, err := NewHTTPServer("127.0.0.1:0", prometheus.NewRegistry(), probes)
		if err != nil {
			t.Fatal(err)
		}
		serve(t, s)
		for _, path := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get("http://" + s.Addr() + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "relay cannot reach PostgreSQL") ||
				!strings.Contains(string(body), "connection refused") {
				t.Errorf("%s: %d %q, want 503 with the reason", path, resp.StatusCode, body)
			}
			for _, secret := range []string{"hidden_user", "hidden_db", host, "pw"} {
				if strings.Contains(string(body), secret) {
					t.Errorf("%s shows %q: %q", path, secret, body)
				}
			}
		}
	}
}

// /debug/pprof is served only when asked for (--http-pprof), then with the
// heap and a CPU profile but never the command line, which can hold a
// password; and asking for it with the server off is an error that names
// both settings.
func TestHTTPPprofIsOptIn(t *testing.T) {
	t.Parallel()
	get := func(addr, path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, on := range []bool{false, true} {
		s, err := NewHTTPServer("127.0.0.1:0", prometheus.NewRegistry(), Probes{})
		if err != nil {
			t.Fatal(err)
		}
		if on {
			s.ServePprof()
		}
		serve(t, s)
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/profile?seconds=1", "/debug/pprof/goroutine?debug=1"} {
			code, body := get(s.Addr(), path)
			if want := map[bool]int{false: http.StatusNotFound, true: http.StatusOK}[on]; code != want {
				t.Errorf("pprof %t: GET %s = %d, want %d: %.200s", on, path, code, want, body)
			}
		}
		if code, body := get(s.Addr(), "/debug/pprof/cmdline"); code != http.StatusNotFound || strings.Contains(body, "cli.test") {
			t.Errorf("pprof %t: GET /debug/pprof/cmdline = %d %q; want 404 without the command line", on, code, body)
		}
		if on && s.srv.WriteTimeout <= 30*time.Second {
			t.Errorf("write timeout %s with pprof: the default 30 s CPU profile would be refused", s.srv.WriteTimeout)
		}
		if code, _ := get(s.Addr(), "/metrics"); code != http.StatusOK {
			t.Errorf("pprof %t: /metrics = %d", on, code)
		}
	}
	h := HTTP{Addr: "off", Pprof: true}
	if _, err := h.Serve(prometheus.NewRegistry(), Probes{}, slog.New(slog.DiscardHandler)); err == nil ||
		!strings.Contains(err.Error(), "--http-pprof") || !strings.Contains(err.Error(), "--http-addr") {
		t.Errorf("--http-pprof with --http-addr off: %v; want an error naming both", err)
	}
}
