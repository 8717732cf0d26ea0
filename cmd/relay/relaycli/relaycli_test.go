package relaycli_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/cmd/relay/relaycli"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

func run(t *testing.T, ctx context.Context, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb ferrytest.Buffer
	code = relaycli.Main(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

// Every wrong setting is refused at start-up by an error that names it, and
// exits 2, as every wrong command line of every Ferry binary does.
func TestSettingsAreValidatedByName(t *testing.T) {
	t.Setenv("FERRY_DATABASE_URL", "")
	t.Setenv("FERRY_KAFKA_BROKERS", "")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run", "--kafka-brokers", "127.0.0.1:9"}, "FERRY_DATABASE_URL"},
		{[]string{"run", "--database-url", "postgres://x@127.0.0.1/x"}, "FERRY_KAFKA_BROKERS"},
		{[]string{"run", "--database-url", "postgres://x@127.0.0.1/x", "--kafka-brokers", "nohost"}, "--kafka-brokers"},
		{[]string{"run", "--database-url", "postgres://x@127.0.0.1/x", "--kafka-brokers", "h:1", "--kafka-sasl-mechanism", "MD5"}, "--kafka-sasl-mechanism"},
		{[]string{"run", "--database-url", "postgres://x@127.0.0.1/x", "--kafka-brokers", "h:1", "--status-interval", "30s"}, "StatusInterval"},
		{[]string{"run", "--database-url", "postgres://x@127.0.0.1/x", "--kafka-brokers", "h:1", "--topic-template", "t.{bogus}"}, "TopicTemplate"},
		{[]string{"run", "--database-url", "postgres://x@127.0.0.1/x", "--kafka-brokers", "h:1", "--slot", "Bad-Slot"}, "Slot"},
		{[]string{"run", "--database-url", "postgres://x@127.0.0.1/x", "--kafka-brokers", "h:1", "--log-format", "xml"}, "--log-format"},
		{[]string{"status"}, "FERRY_DATABASE_URL"},
		{[]string{"quarantine"}, "quarantine list"},
		{[]string{"quarantine", "requeue", "--database-url", "postgres://x@127.0.0.1:1/x"}, "--all"},
		{[]string{"quarantine", "requeue", "--database-url", "postgres://x@127.0.0.1:1/x", "--id", "nope"}, "--id"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"status", "--database-url", "host=/nowhere port=port"}, "--database-url is not a valid PostgreSQL connection string"},
		{[]string{"run", "--database-url", "postgres://x@127.0.0.1/x", "--kafka-brokers", "h:1", "--max-in-flight", "lots"}, "max-in-flight"},
		{[]string{"prune", "--database-url", "postgres://x@127.0.0.1:1/x", "--outbox-retention", "-1h"}, "outbox-retention"},
		{[]string{"prune", "--database-url", "postgres://x@127.0.0.1:1/x", "--slot", "Bad-Slot"}, "slot"},
		{[]string{"migrate", "--database-url", "postgres://x@127.0.0.1:1/x", "sideways"}, "unknown action"},
	}
	for _, c := range cases {
		code, _, stderr := run(t, context.Background(), c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("relay %v: exit %d, stderr %q; want exit 2 naming %s", c.args, code, stderr, c.want)
		}
	}
	// The environment is checked as strictly as the flags.
	t.Setenv("FERRY_STATUS_INTERVAL", "soon")
	code, _, stderr := run(t, context.Background(), "run", "--database-url", "postgres://x@127.0.0.1/x", "--kafka-brokers", "h:1")
	if code != 2 || !strings.Contains(stderr, "FERRY_STATUS_INTERVAL") {
		t.Errorf("relay run with FERRY_STATUS_INTERVAL=soon: exit %d, %q; want exit 2 naming the variable", code, stderr)
	}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// relay schema creates the schema, the publication and the slot; relay run
// then serves metrics and readiness, publishes through a listener that wants
// TLS and SCRAM, and never logs a password, whether Kafka takes it or not;
// relay status shows the slot.
func TestMigrateRunStatus(t *testing.T) {
	db := ferrytest.NewDB(t)
	slot := "cli_" + ferrytest.Suffix()
	const dbSecret, saslSecret = "db-pass-7f3a", "sasl-pass-91c2"
	url := strings.Replace(db.URL, "ferry:ferry@", "ferry:"+dbSecret+"@", 1) // trust auth ignores it
	if url == db.URL {
		t.Fatalf("test URL %s has no password to replace", db.URL)
	}
	t.Setenv("FERRY_DATABASE_URL", url)
	t.Setenv("FERRY_KAFKA_BROKERS", ferrytest.Brokers(t)[0])
	t.Setenv("FERRY_SLOT", slot)

	code, out, stderr := run(t, context.Background(), "schema")
	if code != 0 || !strings.Contains(out, "slot "+slot+" are ready") {
		t.Fatalf("relay schema: exit %d\n%s\n%s", code, out, stderr)
	}
	var exists bool
	if err := db.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&exists); err != nil || !exists {
		t.Fatalf("slot %s exists = %v, %v after relay migrate", slot, exists, err)
	}

	// No password leaks, from a run that authenticates to Kafka (the stack's
	// SASL_SSL listener, SCRAM-SHA-512 over TLS) and publishes, nor from one
	// that Kafka refuses. The logs are at debug level: franz-go's included.
	sec := ferrytest.Secure(t)
	secure := []string{"--kafka-brokers", sec.SASLSSLBrokers, "--kafka-tls", "--kafka-tls-ca-file", sec.CAFile,
		"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-username", sec.User}
	aggregate := "cli" + ferrytest.Suffix()
	ferrytest.CreateTopic(t, "outbox.event."+aggregate, 1)
	t.Setenv("FERRY_KAFKA_SASL_PASSWORD", sec.Password)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	var stderrBuf ferrytest.Buffer
	done := make(chan int)
	go func() {
		done <- relaycli.Main(ctx, append([]string{"run", "--http-addr", addr, "--log-format", "json", "--log-level", "debug"}, secure...),
			io.Discard, &stderrBuf)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		status, body := get("http://" + addr + "/readyz")
		if status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never became ready: %d %s\n%s", status, body, stderrBuf.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	ids, err := outbox.Write(context.Background(), db.Pool, outbox.Event{AggregateType: aggregate, AggregateID: "1", EventType: "Authenticated"})
	if err != nil {
		t.Fatal(err)
	}
	if rec := consumeOne(t, "outbox.event."+aggregate); header(rec, outbox.HeaderID) != ids[0].String() {
		t.Fatalf("published record has id %q, want %s", header(rec, outbox.HeaderID), ids[0])
	}
	if status, body := get("http://" + addr + "/metrics"); status != 200 || !strings.Contains(body, "ferry_relay_events_published_total") ||
		!strings.Contains(body, "ferry_relay_commit_to_ack_seconds") || !strings.Contains(body, "ferry_relay_retained_wal_bytes") {
		t.Fatalf("/metrics: %d, missing Ferry's series:\n%.2000s", status, body)
	}
	if status, _ := get("http://" + addr + "/healthz"); status != 200 {
		t.Fatalf("/healthz: %d", status)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("relay run exited %d after cancellation:\n%s", code, stderrBuf.String())
	}
	logs := stderrBuf.String()
	if !strings.Contains(logs, "beginning sasl authentication") || !strings.Contains(logs, `"mechanism":"SCRAM-SHA-512"`) {
		t.Fatalf("the debug logs do not show the SASL authentication they are meant to cover:\n%s", logs)
	}
	for _, secret := range []string{dbSecret, sec.Password} {
		if strings.Contains(logs, secret) {
			t.Fatalf("a secret appears in the logs of a run that authenticated:\n%s", logs)
		}
	}
	if !strings.Contains(logs, "redacted") {
		t.Fatalf("start-up log does not show the redacted settings:\n%s", logs)
	}

	// A wrong password: Kafka refuses it at start-up, and says so without it.
	t.Setenv("FERRY_KAFKA_SASL_PASSWORD", saslSecret)
	code, _, refused := run(t, context.Background(), append([]string{"run", "--http-addr", "off", "--log-format", "json", "--log-level", "debug"}, secure...)...)
	if code != 1 || !strings.Contains(refused, "SASL_AUTHENTICATION_FAILED") {
		t.Fatalf("relay run with a wrong SASL password: exit %d, want 1 naming SASL_AUTHENTICATION_FAILED:\n%s", code, refused)
	}
	for _, secret := range []string{dbSecret, saslSecret, sec.Password} {
		if strings.Contains(refused, secret) {
			t.Fatalf("a secret appears in the logs of a run Kafka refused:\n%s", refused)
		}
	}

	code, out, stderr = run(t, context.Background(), "quarantine", "list")
	if code != 0 || !strings.Contains(out, "REASON") {
		t.Fatalf("relay quarantine list: exit %d\n%s\n%s", code, out, stderr)
	}
	code, out, stderr = run(t, context.Background(), "quarantine", "requeue", "--all")
	if code != 0 || !strings.Contains(out, "requeued 0 events") || !strings.Contains(out, "database "+db.Name+" on ") {
		t.Fatalf("relay quarantine requeue --all: exit %d\n%s\n%s", code, out, stderr)
	}

	code, out, stderr = run(t, context.Background(), "status")
	if code != 0 || !strings.Contains(out, slot) || !strings.Contains(out, "wal_status") || !strings.Contains(out, "quarantined") {
		t.Fatalf("relay status: exit %d\n%s\n%s", code, out, stderr)
	}

	// An expired row the stopped relay never published stays.
	if _, err := db.Pool.Exec(context.Background(), `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
		VALUES (gen_random_uuid(), 'a', '1', 'E', '', now() - interval '30 days')`); err != nil {
		t.Fatal(err)
	}
	code, out, stderr = run(t, context.Background(), "prune", "--prune-confirm-wait", "200ms")
	if code != 1 || !strings.Contains(out, "deleted 0 confirmed outbox rows") || !strings.Contains(stderr, "not confirmed") || !strings.Contains(out, "database "+db.Name+" on ") {
		t.Fatalf("relay prune with an unpublished expired row: exit %d\n%s\n%s", code, out, stderr)
	}

	// A dropped slot: run refuses and names the way out; recover takes it.
	t.Setenv("FERRY_KAFKA_SASL_PASSWORD", "")
	if _, err := db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = run(t, context.Background(), "run", "--http-addr", "off")
	if code != 1 || !strings.Contains(stderr, "relay recover") || !strings.Contains(stderr, slot) {
		t.Fatalf("relay run without its slot: exit %d, %q; want a failure naming the slot and `relay recover`", code, stderr)
	}
	code, out, stderr = run(t, context.Background(), "recover", "--recover-margin", "1s")
	if code != 0 || !strings.Contains(out, "old slot missing") || !strings.Contains(out, "recovered") {
		t.Fatalf("relay recover: exit %d\n%s\n%s", code, out, stderr)
	}
	code, out, stderr = run(t, context.Background(), "recover")
	if code != 1 || !strings.Contains(stderr, "nothing to recover") {
		t.Fatalf("relay recover of a healthy slot: exit %d\n%s\n%s", code, out, stderr)
	}
}

// consumeOne returns the first record of topic, read through the stack's
// plaintext listener.
func consumeOne(t *testing.T, topic string) *kgo.Record {
	t.Helper()
	ctx := ferrytest.Context(t, 30*time.Second)
	cl := ferrytest.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("no record in %s within 30s", topic)
		}
		if recs := fetches.Records(); len(recs) > 0 {
			return recs[0]
		}
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Every command that takes --slot (or --publication) refuses a name `relay
// run` refuses, by flag, with exit 2, before it reads or changes anything:
// `relay migrate` does not apply the schema and then fail on the slot.
func TestEveryCommandRefusesTheSlotNamesRunRefuses(t *testing.T) {
	t.Parallel()
	db := ferrytest.NewDB(t)
	ctx := ferrytest.Context(t, time.Minute)
	for _, args := range [][]string{
		{"status", "--slot", "a b"},
		{"prune", "--slot", "a b"},
		{"migrate", "--slot", "a b"},
		{"migrate", "--publication", "Bad-Pub"},
		{"recover", "--slot", "a b", "--kafka-brokers", "127.0.0.1:1"},
		{"run", "--slot", "a b", "--kafka-brokers", "127.0.0.1:1", "--http-addr", "off"},
	} {
		flag := args[1]
		code, stdout, stderr := run(t, ctx, append(args, "--database-url", db.URL)...)
		if code != 2 || !strings.Contains(stderr, flag) || !strings.Contains(stderr, "lower-case letters, digits and underscores") {
			t.Errorf("relay %v: exit %d\n%s%s\nwant exit 2 naming %s and the rule", args, code, stdout, stderr, flag)
		}
	}
	var tables int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("%d tables (%v) after commands that were refused, want none", tables, err)
	}
}
