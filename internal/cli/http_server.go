package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Probe answers a health or readiness check: nil means yes.
type Probe func() error

// Probes are what an engine answers over HTTP. A nil probe always says yes;
// a nil Active serves no /activez. A probe that says no answers 503 with its
// reason, in which the values of Hide, and the user, database and host of a
// failed PostgreSQL connection (*pgconn.ConnectError), never show: the
// server listens on every interface of the pod (see HTTP), and the reason
// would tell anyone there where the database is and whom to log in as.
type Probes struct {
	Healthy Probe // /healthz, for a liveness probe: no means restart me
	Ready   Probe // /readyz, for a readiness probe
	Active  Probe // /activez: this process does the work (holds the slot)

	Hide []string // such as the database's user, name and hosts (Database.Names)
}

// Timeouts of the HTTP server: a client that sends slowly, or keeps an idle
// connection open, must not hold a connection indefinitely. Probes and
// scrapes send no body and read one short response.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second // the whole request
	httpWriteTimeout      = 30 * time.Second // the response: /metrics of a busy process takes far less
	httpIdleTimeout       = time.Minute      // between two requests on a keep-alive connection
	// With /debug/pprof served, a response may take as long as the CPU
	// profile or trace asked for (?seconds=N, 30 by default): net/http/pprof
	// refuses N at or beyond the write timeout.
	httpPprofWriteTimeout = 2 * time.Minute
)

// HTTPServer serves /metrics, /healthz and /readyz on one port.
type HTTPServer struct {
	srv *http.Server
	mux *http.ServeMux
	ln  net.Listener
}

// NewHTTPServer listens on addr ("" or "off" disables it; ":0" picks a port).
func NewHTTPServer(addr string, gatherer prometheus.Gatherer, probes Probes) (*HTTPServer, error) {
	if addr == "" || addr == "off" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", probeHandler(probes.Healthy, probes.Hide))
	mux.HandleFunc("GET /readyz", probeHandler(probes.Ready, probes.Hide))
	if probes.Active != nil {
		mux.HandleFunc("GET /activez", probeHandler(probes.Active, probes.Hide))
	}
	return &HTTPServer{
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: httpReadHeaderTimeout,
			ReadTimeout:       httpReadTimeout,
			WriteTimeout:      httpWriteTimeout,
			IdleTimeout:       httpIdleTimeout,
		},
		mux: mux,
		ln:  ln,
	}, nil
}

// ServePprof adds Go's profiles under /debug/pprof/ (net/http/pprof): the
// index, the named profiles (heap, goroutine, allocs, block, mutex,
// threadcreate), a CPU profile (/debug/pprof/profile?seconds=N, N under
// 120) and an execution trace (/debug/pprof/trace?seconds=N). Not
// /debug/pprof/cmdline: a command line can hold a password. Call it before
// Run.
func (s *HTTPServer) ServePprof() {
	if s == nil {
		return
	}
	s.srv.WriteTimeout = httpPprofWriteTimeout
	s.mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	s.mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	s.mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	s.mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	s.mux.HandleFunc("GET /debug/pprof/cmdline", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not served: a command line can hold a password", http.StatusNotFound)
	})
}

func probeHandler(p Probe, hide []string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if p != nil {
			if err := p(); err != nil {
				http.Error(w, publicReason(err, hide), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	}
}

// publicReason is err's text without the values of hide, the user, database
// and hosts of a failed PostgreSQL connection in err, or IP addresses.
func publicReason(err error, hide []string) string {
	names := slices.Clone(hide)
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Config != nil {
		names = append(names, ce.Config.User, ce.Config.Database, ce.Config.Host)
		for _, fb := range ce.Config.Fallbacks {
			names = append(names, fb.Host)
		}
	}
	// Longest first, so that a name inside another goes with it.
	slices.SortFunc(names, func(a, b string) int { return len(b) - len(a) })
	s := err.Error()
	for _, name := range names {
		s = hideWord(s, name)
	}
	return addressLike.ReplaceAllStringFunc(s, func(tok string) string {
		if net.ParseIP(tok) != nil {
			return redacted
		}
		if host, port, err := net.SplitHostPort(tok); err == nil && net.ParseIP(host) != nil {
			return redacted + ":" + port
		}
		return tok
	})
}

const redacted = "<redacted>"

// addressLike finds candidates for IP addresses, with or without a port.
var addressLike = regexp.MustCompile(`[0-9A-Fa-f:.\[\]]+`)

// hideWord replaces the occurrences of word in s that stand alone, not
// inside a longer name ("ferry" in "ferry_orders").
func hideWord(s, word string) string {
	if word == "" {
		return s
	}
	inName := func(b byte) bool {
		return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '_' || b == '.' || b == '-'
	}
	var out strings.Builder
	for {
		i := strings.Index(s, word)
		if i < 0 {
			break
		}
		end := i + len(word)
		if (i > 0 && inName(s[i-1])) || (end < len(s) && inName(s[end])) {
			out.WriteString(s[:i+1])
			s = s[i+1:]
			continue
		}
		out.WriteString(s[:i])
		out.WriteString(redacted)
		s = s[end:]
	}
	out.WriteString(s)
	return out.String()
}

// Addr is the address the server listens on.
func (s *HTTPServer) Addr() string {
	if s == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Run serves until ctx ends, then shuts down.
func (s *HTTPServer) Run(ctx context.Context, logger *slog.Logger) {
	if s == nil {
		return
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(sctx)
	}()
	logger.Info("http server listening", slog.String("addr", s.Addr()))
	if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Error("http server stopped", slog.String("error", err.Error()))
	}
}

// HTTP is the --http-addr setting: where /metrics, /healthz and /readyz
// are served. The binaries' defaults (":9187", ":9188") listen on every
// interface, not loopback, because Kubernetes sends its probes, and
// Prometheus its scrapes, to the pod's IP; the answers hold no secret and
// no database address (see Probes).
//
// Pprof (--http-pprof, off by default) adds /debug/pprof/ on the same
// address (HTTPServer.ServePprof): a profile tells whoever reaches the port
// what the process runs and holds in memory, so it is for a port only
// operators reach, switched on while profiling.
type HTTP struct {
	Addr  string
	Pprof bool
}

// Register binds the settings to f with the binary's default address.
func (h *HTTP) Register(f *Flags, def string) {
	f.StringVar(&h.Addr, "http-addr", def, "address of /metrics, /healthz and /readyz; off disables")
	f.BoolVar(&h.Pprof, "http-pprof", false, "also serve Go's profiles under /debug/pprof/ on --http-addr (CPU, heap, goroutines, trace; not the command line); for a port only operators reach")
}

// Serve is ServeHTTP on the configured address, with /debug/pprof/ when
// Pprof is set.
func (h *HTTP) Serve(gatherer prometheus.Gatherer, probes Probes, logger *slog.Logger) (stop func(), err error) {
	if h.Pprof && (h.Addr == "" || h.Addr == "off") {
		return nil, fmt.Errorf("--http-pprof: serves on --http-addr, which is %q: give it an address", h.Addr)
	}
	srv, err := NewHTTPServer(h.Addr, gatherer, probes)
	if err != nil {
		return nil, err
	}
	if h.Pprof {
		srv.ServePprof()
	}
	return run(srv, logger), nil
}

// NewRegistry returns a metrics registry with the Go runtime's and the
// process's collectors, for an engine's Config.Registerer.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// ServeHTTP listens on addr and serves /metrics, /healthz and /readyz in the
// background until the returned stop is called. It outlives the engine's
// context on purpose: the probes answer while the engine drains.
func ServeHTTP(addr string, gatherer prometheus.Gatherer, probes Probes, logger *slog.Logger) (stop func(), err error) {
	srv, err := NewHTTPServer(addr, gatherer, probes)
	if err != nil {
		return nil, err
	}
	return run(srv, logger), nil
}

// run serves srv in the background until the returned stop is called.
func run(srv *HTTPServer, logger *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	go srv.Run(ctx, logger)
	return cancel
}
