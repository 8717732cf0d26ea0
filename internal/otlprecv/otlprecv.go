// Package otlprecv is a minimal OpenTelemetry trace receiver: an HTTP
// handler for OTLP/HTTP protobuf exports (POST /v1/traces) that keeps the
// spans in memory. The reserva demo points its processes at one to print an
// order's trace, and tests use it to see what the binaries export.
package otlprecv

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one exported span.
type Span struct {
	TraceID, SpanID, ParentID string // hex; ParentID empty for a root
	Name                      string
	Service                   string // its resource's service.name
	Kind                      tracepb.Span_SpanKind
	Start, End                time.Time
	Attributes                map[string]string
}

// Receiver keeps every span posted to it; with CountOnly it only counts
// them (a benchmark's million spans would not fit).
type Receiver struct {
	CountOnly bool

	mu    sync.Mutex
	spans []Span
	count int
}

// maxBody bounds one export request.
const maxBody = 16 << 20

func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "POST /v1/traces only", http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, maxBody))
	var export collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &export)
	}
	if err != nil {
		http.Error(w, "not an OTLP protobuf trace export: "+err.Error(), http.StatusBadRequest)
		return
	}
	var got []Span
	if r.CountOnly {
		n := 0
		for _, rs := range export.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				n += len(ss.Spans)
			}
		}
		r.mu.Lock()
		r.count += n
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		return
	}
	for _, rs := range export.ResourceSpans {
		service := value(rs.GetResource().GetAttributes(), "service.name")
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				sp := Span{TraceID: hex.EncodeToString(s.TraceId), SpanID: hex.EncodeToString(s.SpanId), ParentID: hex.EncodeToString(s.ParentSpanId),
					Name: s.Name, Service: service, Kind: s.Kind,
					Start: time.Unix(0, int64(s.StartTimeUnixNano)), End: time.Unix(0, int64(s.EndTimeUnixNano)),
					Attributes: map[string]string{}}
				for _, kv := range s.Attributes {
					sp.Attributes[kv.Key] = text(kv.GetValue())
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.count += len(got)
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// Count is how many spans were received so far.
func (r *Receiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Spans returns every span received so far (none with CountOnly).
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans)
}

// Trace returns the spans of one trace, by start time.
func (r *Receiver) Trace(traceID string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b Span) int { return a.Start.Compare(b.Start) })
	return out
}

// Tree renders spans (one trace) as an indented tree, children under their
// parent by start time, each line with its service, name, start offset from
// the root and duration. A span whose parent is not among them is a root.
func Tree(spans []Span, indent string) string {
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.SpanID] = true
	}
	children := map[string][]Span{}
	var roots []Span
	for _, s := range spans {
		if s.ParentID == "" || !ids[s.ParentID] {
			roots = append(roots, s)
		} else {
			children[s.ParentID] = append(children[s.ParentID], s)
		}
	}
	if len(roots) == 0 {
		return ""
	}
	t0 := roots[0].Start
	var b strings.Builder
	var walk func(s Span, depth int)
	walk = func(s Span, depth int) {
		fmt.Fprintf(&b, "%s%s%-*s %-14s +%7.1f ms %7.1f ms\n", indent, strings.Repeat("  ", depth), 52-2*depth, s.Name, s.Service,
			ms(s.Start.Sub(t0)), ms(s.End.Sub(s.Start)))
		for _, c := range children[s.SpanID] {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func value(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.Key == key {
			return text(kv.GetValue())
		}
	}
	return ""
}

func text(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	}
	return ""
}
