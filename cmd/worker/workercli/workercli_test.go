package workercli_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/schema"
)

func run(ctx context.Context, app *workercli.App, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = workercli.Main(ctx, args, &out, &errOut, app)
	return code, out.String(), errOut.String()
}

// One exit-code rule: 0 for help, 2 for a wrong command line, with an
// error that names the setting.
func TestUsage(t *testing.T) {
	t.Setenv("FERRY_DATABASE_URL", "")
	t.Setenv("FERRY_KAFKA_BROKERS", "")
	ctx := context.Background()
	if code, _, stderr := run(ctx, nil); code != 2 || !strings.Contains(stderr, "worker dlq list") {
		t.Errorf("no command: exit %d, %q", code, stderr)
	}
	if code, stdout, _ := run(ctx, nil, "help"); code != 0 || !strings.Contains(stdout, "worker dlq redrive") {
		t.Errorf("help: exit %d, %q", code, stdout)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, "unknown command"},
		{[]string{"prune"}, "--database-url"},
		{[]string{"prune", "--database-url", "postgres://x@127.0.0.1:1/x", "--prune-batch-size", "many"}, "prune-batch-size"},
		{[]string{"prune", "--database-url", "not a url at all: %"}, "--database-url is not a valid PostgreSQL connection string"},
		{[]string{"migrate", "--database-url", "postgres://x@127.0.0.1:1/x", "sideways"}, "unknown action"},
		{[]string{"migrate", "--database-url", "postgres://x@127.0.0.1:1/x", "--log-level", "loud"}, "--log-level"},
		{[]string{"status", "--database-url", "postgres://x@127.0.0.1:1/x", "--kafka-brokers", "h:1"}, "--consumers is required"},
		{[]string{"status", "--database-url", "postgres://x@127.0.0.1:1/x", "--consumers", "c"}, "--kafka-brokers"},
		{[]string{"dlq", "redrive", "--topic", "t.dlq", "--kafka-brokers", "localhost:9092"}, "--all"},
		{[]string{"dlq", "list", "--kafka-brokers", "localhost:9092"}, "--topic is required"},
		{[]string{"scaffold", "--dir", t.TempDir()}, "NAME and --dir are required"},
		{[]string{"run", "--database-url", "postgres://x@127.0.0.1:1/x"}, "hosts no handlers"},
	}
	for _, c := range cases {
		code, _, stderr := run(ctx, nil, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("worker %v: exit %d, stderr %q; want exit 2 naming %q", c.args, code, stderr, c.want)
		}
	}
}

// A malformed environment variable is refused by name, as a flag would be,
// instead of silently keeping the default.
func TestEnvironmentIsValidatedByName(t *testing.T) {
	t.Setenv("FERRY_PRUNE_BATCH_SIZE", "lots")
	t.Setenv("FERRY_DATABASE_URL", "postgres://x@127.0.0.1:1/x")
	code, _, stderr := run(context.Background(), nil, "prune")
	if code != 2 || !strings.Contains(stderr, "FERRY_PRUNE_BATCH_SIZE") {
		t.Errorf("prune with FERRY_PRUNE_BATCH_SIZE=lots: exit %d, %q; want exit 2 naming the variable", code, stderr)
	}
	t.Setenv("FERRY_PRUNE_BATCH_SIZE", "")
	t.Setenv("FERRY_INBOX_RETENTION", "a fortnight")
	code, _, stderr = run(context.Background(), nil, "prune")
	if code != 2 || !strings.Contains(stderr, "FERRY_INBOX_RETENTION") {
		t.Errorf("prune with FERRY_INBOX_RETENTION='a fortnight': exit %d, %q; want exit 2 naming the variable", code, stderr)
	}
}

// Ferry's own binary has no `run`; an application's binary has, under its
// own name.
func TestRunBelongsToTheApplication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, stdout, _ := run(ctx, nil, "help"); strings.Contains(stdout, "worker run") {
		t.Errorf("Ferry's worker help offers run, which needs handlers:\n%s", stdout)
	}
	app := &workercli.App{Name: "billing-worker", Register: func(*inbox.Worker) error { return nil }}
	if _, stdout, _ := run(ctx, app, "help"); !strings.Contains(stdout, "billing-worker run ") || !strings.Contains(stdout, "billing-worker dlq list") {
		t.Errorf("an application's help lacks its run or its name:\n%s", stdout)
	}
}

func TestMigrateAndPrune(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewDB(t)
	// An application's binary migrates Ferry's tables, then its own; down
	// rolls back its own first.
	app := &workercli.App{Migrations: []schema.Set{{VersionTable: "app_schema_version", FS: fstest.MapFS{
		"00001_extra.sql": {Data: []byte("-- +goose Up\nCREATE TABLE extra (id int);\n-- +goose Down\nDROP TABLE extra;\n")},
	}}}}
	code, stdout, stderr := run(ctx, app, "schema", "--database-url", db.URL, "--log-level", "warn")
	if code != 0 || !strings.Contains(stdout, "(table ferry_schema_version)") ||
		!strings.Contains(stdout, "schema version 1 of 1 (table app_schema_version)") {
		t.Fatalf("migrate: exit %d\n%s\n%s", code, stdout, stderr)
	}
	// down names its database and wants --yes; flags after it count.
	code, stdout, stderr = run(ctx, app, "migrate", "down", "--database-url", db.URL, "--log-level", "warn")
	if code != 2 || !strings.Contains(stderr, "--yes") || !strings.Contains(stderr, "database "+db.Name) {
		t.Fatalf("migrate down without --yes: exit %d\n%s\n%s\nwant exit 2 naming --yes and database %s", code, stdout, stderr, db.Name)
	}
	code, stdout, stderr = run(ctx, app, "migrate", "down", "--database-url", db.URL, "--log-level", "warn", "--yes")
	if code != 0 || !strings.Contains(stdout, "database "+db.Name) || !strings.Contains(stdout, "rolled back 00001_extra.sql") ||
		!strings.Contains(stdout, "(table ferry_schema_version)") || !strings.Contains(stdout, "schema version 0 of 1 (table app_schema_version)") {
		t.Fatalf("migrate down --yes: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO inbox (consumer, message_id, processed_at)
		SELECT 'c', 'm' || i, now() - interval '30 days' FROM generate_series(1, 25) i`); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = run(ctx, nil, "prune", "--database-url", db.URL, "--inbox-retention", "1h")
	if code != 2 || !strings.Contains(stderr, "take effect twice") {
		t.Fatalf("prune with a 1h window: exit %d, %q; want a refusal explaining duplicates", code, stderr)
	}
	code, stdout, stderr = run(ctx, nil, "prune", "--database-url", db.URL, "--inbox-retention", "14d", "--prune-batch-size", "10")
	if code != 0 || !strings.Contains(stdout, "deleted 25 inbox rows in 3 batches") || !strings.Contains(stdout, "database "+db.Name+" on ") {
		t.Fatalf("prune: exit %d\n%s\n%s", code, stdout, stderr)
	}
}

// `worker run` hosts the handlers its main registers, serves metrics and
// readiness, and exits 0 when its context ends (SIGTERM in the binary).
func TestRunHostsRegisteredHandlers(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, 2*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	topic := ferrytest.Topic(t, 1)
	brokers := strings.Join(ferrytest.Brokers(t), ",")
	applied := make(chan string, 1)
	register := func(w *inbox.Worker) error {
		w.Handle("cmd-test", topic, func(_ context.Context, _ pgx.Tx, m *inbox.Message) error {
			applied <- m.ID
			return nil
		})
		return nil
	}
	none := &workercli.App{Register: func(*inbox.Worker) error { return nil }}
	if code, _, stderr := run(ctx, none, "run", "--database-url", db.URL, "--kafka-brokers", brokers, "--http-addr", "off"); code != 1 || !strings.Contains(stderr, "no handlers registered") {
		t.Fatalf("run without handlers: exit %d, %q", code, stderr)
	}

	addr := freeAddr(t)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- workercli.Main(runCtx, []string{"run", "--database-url", db.URL, "--kafka-brokers", brokers,
			"--http-addr", addr, "--log-format", "json", "--prune-interval", "0"}, io.Discard, &stderr, &workercli.App{Register: register})
	}()
	producer := ferrytest.Client(t)
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("x"),
		Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("m-1")}}}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-applied:
		if id != "m-1" {
			t.Fatalf("applied %q", id)
		}
	case code := <-done:
		t.Fatalf("run exited %d: %s", code, stderr.String())
	case <-ctx.Done():
		t.Fatalf("nothing applied: %s", stderr.String())
	}
	// The handler ran inside the transaction that records the inbox row:
	// wait for the commit, or status may read the table before it.
	for n := 0; n != 1; {
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE consumer = 'cmd-test'`).Scan(&n); err != nil {
			t.Fatalf("inbox row of m-1 never committed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// status reads the group from Kafka and the inbox row from PostgreSQL.
	code, stdout, stderr2 := run(ctx, nil, "status", "--database-url", db.URL, "--kafka-brokers", brokers, "--consumers", "cmd-test")
	if fields := strings.Fields(lastLine(stdout)); code != 0 || len(fields) < 5 || fields[0] != "cmd-test" || fields[1] != "Stable" || fields[2] != "1" {
		t.Errorf("status: exit %d, want cmd-test Stable with 1 member:\n%s%s", code, stdout, stderr2)
	} else if rows := fields[len(fields)-2]; rows != "1" {
		t.Errorf("status: %s inbox rows, want 1:\n%s", rows, stdout)
	}
	if body := get(t, ctx, "http://"+addr+"/readyz"); body != "ok\n" {
		t.Errorf("/readyz: %q", body)
	}
	if body := get(t, ctx, "http://"+addr+"/metrics"); !strings.Contains(body, `ferry_worker_messages_processed_total{consumer="cmd-test"`) {
		t.Errorf("/metrics lacks the processed counter:\n%s", body)
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("run exited %d after its context ended, want 0: %s", code, stderr.String())
	}
}

// `worker dlq list` shows what failed, why, when and from where; `worker
// dlq redrive` republishes it with its id to its original partition.
func TestDeadLetterCommands(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	topic := ferrytest.Topic(t, 2)
	dlq := topic + ".dlq"
	ferrytest.CreateTopic(t, dlq, 1)
	brokers := strings.Join(ferrytest.Brokers(t), ",")
	failedAt := time.Now().UTC()
	dead := func(id string) *kgo.Record {
		return &kgo.Record{Topic: dlq, Key: []byte("k-" + id), Value: []byte("payload-" + id), Headers: []kgo.RecordHeader{
			{Key: "id", Value: []byte(id)},
			{Key: inbox.HeaderDeadLetterReason, Value: []byte(inbox.ReasonPermanent)},
			{Key: inbox.HeaderDeadLetterError, Value: []byte("no such order")},
			{Key: inbox.HeaderDeadLetterAttempts, Value: []byte("1")},
			{Key: inbox.HeaderDeadLetterOriginalTopic, Value: []byte(topic)},
			{Key: inbox.HeaderDeadLetterOriginalPartition, Value: []byte("1")},
			{Key: inbox.HeaderDeadLetterOriginalOffset, Value: []byte("7")},
			{Key: inbox.HeaderDeadLetterOriginalTimestamp, Value: []byte(failedAt.Add(-time.Minute).Format(time.RFC3339Nano))},
			{Key: inbox.HeaderDeadLetterConsumer, Value: []byte("billing")},
			{Key: inbox.HeaderDeadLetterFailedAt, Value: []byte(failedAt.Format(time.RFC3339Nano))},
		}}
	}
	producer := ferrytest.Client(t)
	if err := producer.ProduceSync(ctx, dead("m-1"), dead("m-2")).FirstErr(); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := run(ctx, nil, "dlq", "list", "--topic", dlq, "--kafka-brokers", brokers, "--since", "1h")
	if code != 0 || !strings.Contains(stdout, "2 dead letters") || !strings.Contains(stdout, fmt.Sprintf("%s/1/7", topic)) ||
		!strings.Contains(stdout, `"no such order"`) || !strings.Contains(stdout, "billing") {
		t.Fatalf("dlq list: exit %d\n%s\n%s", code, stdout, stderr)
	}
	code, stdout, _ = run(ctx, nil, "dlq", "list", "--topic", dlq, "--kafka-brokers", brokers, "--until", "1h")
	if code != 0 || !strings.Contains(stdout, "0 dead letters") {
		t.Fatalf("dlq list --until 1h ago: exit %d\n%s", code, stdout)
	}

	code, stdout, stderr = run(ctx, nil, "dlq", "redrive", "--topic", dlq, "--kafka-brokers", brokers, "--id", "m-2")
	if code != 0 || !strings.Contains(stdout, "1 redriven, 0 skipped") || !strings.Contains(stdout, "dead-letter topic "+dlq+" on "+brokers) {
		t.Fatalf("dlq redrive: exit %d\n%s\n%s", code, stdout, stderr)
	}
	consumer := ferrytest.Client(t, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {1: kgo.NewOffset().AtStart()}}))
	var got *kgo.Record
	for got == nil {
		fetches := consumer.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("redriven record not found on the original partition")
		}
		if recs := fetches.Records(); len(recs) > 0 {
			got = recs[0]
		}
	}
	headers := map[string]string{}
	for _, h := range got.Headers {
		headers[h.Key] = string(h.Value)
	}
	if string(got.Key) != "k-m-2" || string(got.Value) != "payload-m-2" || headers["id"] != "m-2" ||
		headers[inbox.HeaderRedrivenFrom] == "" || headers[inbox.HeaderDeadLetterReason] != "" {
		t.Errorf("redriven record %q=%q headers %v", got.Key, got.Value, headers)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// get retries until the server answers 200 or the context ends.
func get(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	var last error
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return string(body)
			}
			err = errors.New(resp.Status + ": " + string(body))
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("GET %s: %v", url, last)
	return ""
}

// `worker scaffold` writes a new worker; internal/scaffold's own test
// builds and tests one.
func TestScaffold(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	code, stdout, stderr := run(context.Background(), nil, "scaffold", "stock-audit", "--dir", dir)
	if code != 0 || !strings.Contains(stdout, "stockaudit.go") || !strings.Contains(stdout, "stock-audit-worker") {
		t.Fatalf("scaffold: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if code, _, stderr := run(context.Background(), nil, "scaffold", "stock-audit", "--dir", dir); code != 1 || !strings.Contains(stderr, "exists") {
		t.Errorf("scaffold over existing files: exit %d, %q; want a refusal", code, stderr)
	}
	if code, _, _ := run(context.Background(), nil, "scaffold", "--dir", dir); code != 2 {
		t.Errorf("scaffold without NAME: exit %d, want 2", code)
	}
}

// `worker migrate --inbox-partitioning daily` partitions an empty inbox
// after the migrations; a value it does not know is refused by flag name.
func TestMigrateInboxPartitioning(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewDB(t)
	code, out, stderr := run(ctx, nil, "migrate", "--database-url", db.URL, "--inbox-partitioning", "monthly")
	if code != 2 || !strings.Contains(stderr, "--inbox-partitioning (FERRY_INBOX_PARTITIONING)") || !strings.Contains(stderr, `"monthly"`) {
		t.Fatalf("migrate --inbox-partitioning monthly: exit %d\n%s%s\nwant exit 2 naming the flag and the value", code, out, stderr)
	}
	code, out, stderr = run(ctx, nil, "migrate", "--database-url", db.URL, "--inbox-partitioning", "daily")
	if code != 0 || !strings.Contains(out, "inbox is partitioned daily") {
		t.Fatalf("migrate --inbox-partitioning daily: exit %d\n%s%s", code, out, stderr)
	}
	var kind string
	if err := db.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'inbox'::regclass`).Scan(&kind); err != nil || kind != "p" {
		t.Fatalf("after migrate --inbox-partitioning daily the inbox's relkind is %q (%v), want p", kind, err)
	}
}

// FERRY_DLQ_SUFFIX="" is the empty suffix, refused as --dlq-suffix "" is:
// not unset, which would quietly take the default.
func TestAnEmptyDLQSuffixInTheEnvironmentIsRefused(t *testing.T) {
	t.Setenv("FERRY_DLQ_SUFFIX", "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	app := &workercli.App{Register: func(w *inbox.Worker) error {
		w.Handle("c", "t", func(context.Context, pgx.Tx, *inbox.Message) error { return nil })
		return nil
	}}
	code, _, stderr := run(ctx, app, "run", "--database-url", "postgres://x@127.0.0.1:1/x?connect_timeout=1", "--kafka-brokers", "127.0.0.1:1",
		"--http-addr", "off")
	if code != 2 || !strings.Contains(stderr, "FERRY_DLQ_SUFFIX") || !strings.Contains(stderr, "empty") {
		t.Fatalf("worker run with FERRY_DLQ_SUFFIX='': exit %d, %q; want 2 saying the suffix is empty", code, stderr)
	}
}

// `worker status` on a database without Ferry's tables says that the inbox
// is missing and how to make it, whatever Kafka knows of the consumer.
func TestStatusWithoutTheInboxSaysSo(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewDB(t) // no migrations
	code, stdout, stderr := run(ctx, nil, "status", "--database-url", db.URL, "--kafka-brokers", strings.Join(ferrytest.Brokers(t), ","),
		"--consumers", ferrytest.Name(t, "never-ran"))
	if code != 1 || !strings.Contains(stderr, "inbox table does not exist") || !strings.Contains(stderr, "worker schema") {
		t.Fatalf("status on a database without migrations: exit %d\n%s%s\nwant 1 saying the inbox table does not exist", code, stdout, stderr)
	}
}
