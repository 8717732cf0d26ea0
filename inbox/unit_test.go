package inbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestConfigDefaultsAndValidation(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{}
	kopts := []kgo.Opt{kgo.SeedBrokers("localhost:9092")}
	c := Config{DB: pool, KafkaOpts: kopts}.WithDefaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if c.HealthTimeout != HealthTimeoutDefault {
		t.Fatalf("HealthTimeout defaults to %s, want %s", c.HealthTimeout, HealthTimeoutDefault)
	}
	// A long handler timeout raises the default rather than failing it.
	long := Config{DB: pool, KafkaOpts: kopts, HandlerTimeout: 5 * time.Minute}.WithDefaults()
	if err := long.validate(); err != nil || long.HealthTimeout <= long.HandlerTimeout {
		t.Fatalf("HandlerTimeout 5m: HealthTimeout %s, %v", long.HealthTimeout, err)
	}
	if c.MigrationReportWindow != MigrationReportWindowDefault || MigrationReportWindowDefault != 2*time.Minute {
		t.Fatalf("MigrationReportWindow defaults to %s, want 2m", c.MigrationReportWindow)
	}
	if c.OffsetReset != OffsetResetEarliest || c.BatchSize != BatchSizeDefault || c.KeyConcurrency != 1 || c.DeadLetterTopic("a.b") != "a.b.dlq" {
		t.Fatalf("defaults: %+v", c)
	}
	for _, tc := range []struct {
		mutate func(*Config)
		want   string
	}{
		{func(c *Config) { c.DB = nil }, "Config.DB"},
		{func(c *Config) { c.KafkaOpts = nil }, "Config.KafkaOpts"},
		{func(c *Config) { c.BatchSize = -1 }, "Config.BatchSize"},
		{func(c *Config) { c.RetryBackoffMax = time.Millisecond }, "Config.RetryBackoffMax"},
		{func(c *Config) { c.OffsetReset = "smallest" }, "Config.OffsetReset"},
		// A liveness limit a healthy handler call can reach would restart
		// healthy workers.
		{func(c *Config) { c.HealthTimeout = time.Minute }, "Config.HealthTimeout"},
		{func(c *Config) { c.HealthTimeout = -time.Second }, "Config.HealthTimeout"},
		{func(c *Config) { c.Prune = &PruneConfig{InboxRetention: time.Hour} }, "InboxRetention"},
		// A window no copy outlives the allowed lateness in never shows a
		// missing shadow.
		{func(c *Config) { c.MigrationReportWindow = 30 * time.Second }, "Config.MigrationReportWindow"},
		{func(c *Config) { c.MigrationReportWindow = -time.Minute }, "Config.MigrationReportWindow"},
		// Pruning runs statements outside a transaction: a DB that can only
		// begin transactions is refused at start-up, not found out later.
		{func(c *Config) { c.DB = beginOnly{pool}; c.Prune = &PruneConfig{} }, "Config.Prune needs a Config.DB"},
	} {
		c := Config{DB: pool, KafkaOpts: kopts}
		tc.mutate(&c)
		_, err := New(&c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New: %v, want an error naming %s", err, tc.want)
		}
	}
}

// beginOnly is a DB with nothing but Begin.
type beginOnly struct{ p *pgxpool.Pool }

func (b beginOnly) Begin(ctx context.Context) (pgx.Tx, error) { return b.p.Begin(ctx) }

// Each reset policy maps to explicit franz-go start and reset offsets: a
// committed offset that fell out of range resumes at the log start (never
// skipping), except that "none" refuses to guess at all.
func TestOffsetResetPolicies(t *testing.T) {
	t.Parallel()
	start, end := kgo.NewOffset().AtStart(), kgo.NewOffset().AtEnd()
	for _, tc := range []struct {
		r            OffsetReset
		start, reset kgo.Offset
	}{
		{OffsetResetEarliest, start, start},
		{OffsetResetLatest, end, start},
		{OffsetResetNone, kgo.NewOffset().AtCommitted(), kgo.NoResetOffset()},
	} {
		if s, r := tc.r.offsets(); s != tc.start || r != tc.reset {
			t.Errorf("%s: start %v reset %v, want %v %v", tc.r, s, r, tc.start, tc.reset)
		}
	}
}

func TestMessageDecoding(t *testing.T) {
	t.Parallel()
	rec := func(headers ...string) *kgo.Record {
		r := &kgo.Record{Topic: "t", Key: []byte("k"), Value: []byte("v")}
		for i := 0; i < len(headers); i += 2 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
		}
		return r
	}
	m, bad := newMessage("c", rec("id", "abc", "event_type", "Placed", "aggregate_type", "order", "aggregate_id", "7"), false, time.Now())
	if bad != nil || m.ID != "abc" || m.EventType != "Placed" || m.AggregateType != "order" || m.AggregateID != "7" {
		t.Fatalf("decoded %+v, %v", m, bad)
	}
	if v, ok := m.Header("aggregate_id"); !ok || v != "7" {
		t.Fatalf("Header: %q %v", v, ok)
	}
	for _, tc := range []struct {
		r      *kgo.Record
		reason DeadLetterReason
	}{
		{rec(), ReasonMissingID},
		{rec("id", ""), ReasonMissingID},
		{rec("id", strings.Repeat("x", MaxIDLength+1)), ReasonUndecodable},
		{rec("id", "a\x00b"), ReasonUndecodable},
		{rec("id", "\xff"), ReasonUndecodable},
	} {
		if _, bad := newMessage("c", tc.r, false, time.Now()); bad == nil || bad.reason != tc.reason {
			t.Errorf("headers %v: %v, want reason %s", tc.r.Headers, bad, tc.reason)
		}
	}
	// Opt-in: an id derived from key and value, stable and distinct.
	m1, _ := newMessage("c", rec(), true, time.Now())
	m2, _ := newMessage("c", rec(), true, time.Now())
	other := rec()
	other.Key, other.Value = []byte("kv"), []byte("")
	m3, _ := newMessage("c", other, true, time.Now())
	if m1 == nil || m1.ID != m2.ID || m1.ID == m3.ID || !strings.HasPrefix(m1.ID, "sha256:") {
		t.Fatalf("hash ids %v %v %v", m1, m2, m3)
	}
}

func TestPermanentErrors(t *testing.T) {
	t.Parallel()
	base := errors.New("no such order")
	for _, err := range []error{Permanent(base), Undecodable(base), errors.Join(errors.New("x"), Permanent(base))} {
		if !IsPermanent(err) || !errors.Is(err, base) {
			t.Errorf("%v: IsPermanent %v, Is(base) %v", err, IsPermanent(err), errors.Is(err, base))
		}
	}
	if IsPermanent(base) || Permanent(nil) != nil {
		t.Error("a plain error is not permanent; Permanent(nil) is nil")
	}
	if permanentReason(Undecodable(base)) != ReasonUndecodable || permanentReason(Permanent(base)) != ReasonPermanent {
		t.Error("reasons")
	}
}
