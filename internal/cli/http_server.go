package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Probe answers a health or readiness check: nil means yes.
type Probe func() error

// Probes are what an engine answers over HTTP. A nil probe always says yes;
// a nil Active serves no /activez.
type Probes struct {
	Healthy Probe // /healthz, for a liveness probe: no means restart me
	Ready   Probe // /readyz, for a readiness probe
	Active  Probe // /activez: this process does the work (holds the slot)
}

// HTTPServer serves /metrics, /healthz and /readyz on one port.
type HTTPServer struct {
	srv *http.Server
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
	mux.HandleFunc("GET /healthz", probeHandler(probes.Healthy))
	mux.HandleFunc("GET /readyz", probeHandler(probes.Ready))
	if probes.Active != nil {
		mux.HandleFunc("GET /activez", probeHandler(probes.Active))
	}
	return &HTTPServer{
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		ln:  ln,
	}, nil
}

func probeHandler(p Probe) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if p != nil {
			if err := p(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	}
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
// are served.
type HTTP struct {
	Addr string
}

// Register binds the setting to f with the binary's default address.
func (h *HTTP) Register(f *Flags, def string) {
	f.StringVar(&h.Addr, "http-addr", def, "address of /metrics, /healthz and /readyz; off disables")
}

// Serve is ServeHTTP on the configured address.
func (h *HTTP) Serve(gatherer prometheus.Gatherer, probes Probes, logger *slog.Logger) (stop func(), err error) {
	return ServeHTTP(h.Addr, gatherer, probes, logger)
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
	ctx, cancel := context.WithCancel(context.Background())
	go srv.Run(ctx, logger)
	return cancel, nil
}
