package workercmd_test

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
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/inbox/workercmd"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

func run(ctx context.Context, register []workercmd.Register, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = workercmd.Main(ctx, args, &out, &errOut, register...)
	return code, out.String(), errOut.String()
}

func TestUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if code, _, stderr := run(ctx, nil); code != 2 || !strings.Contains(stderr, "worker run") {
		t.Errorf("no command: exit %d, %q", code, stderr)
	}
	if code, stdout, _ := run(ctx, nil, "help"); code != 0 || !strings.Contains(stdout, "worker dlq redrive") {
		t.Errorf("help: exit %d, %q", code, stdout)
	}
	if code, _, _ := run(ctx, nil, "bogus"); code != 2 {
		t.Errorf("unknown command: exit %d, want 2", code)
	}
	if code, _, stderr := run(ctx, nil, "run", "--kafka-brokers", "localhost:9092"); code != 2 || !strings.Contains(stderr, "--database-url") {
		t.Errorf("run without a database: exit %d, %q", code, stderr)
	}
	if code, _, stderr := run(ctx, nil, "dlq", "redrive", "--topic", "t.dlq", "--kafka-brokers", "localhost:9092"); code != 2 || !strings.Contains(stderr, "--all") {
		t.Errorf("redrive without a selection: exit %d, %q", code, stderr)
	}
}

func TestMigrateAndPrune(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewDB(t)
	code, stdout, stderr := run(ctx, nil, "migrate", "--database-url", db.URL, "--log-level", "warn")
	if code != 0 || !strings.Contains(stdout, "schema version 1 of 1") {
		t.Fatalf("migrate: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO inbox (consumer, message_id, processed_at)
		SELECT 'c', 'm' || i, now() - interval '30 days' FROM generate_series(1, 25) i`); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = run(ctx, nil, "prune", "--database-url", db.URL, "--inbox-retention", "1h")
	if code != 1 || !strings.Contains(stderr, "take effect twice") {
		t.Fatalf("prune with a 1h window: exit %d, %q; want a refusal explaining duplicates", code, stderr)
	}
	code, stdout, stderr = run(ctx, nil, "prune", "--database-url", db.URL, "--inbox-retention", "14d", "--prune-batch-size", "10")
	if code != 0 || !strings.Contains(stdout, "deleted 25 inbox rows and 0 outbox rows in 4 batches") {
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
	if code, _, stderr := run(ctx, nil, "run", "--database-url", db.URL, "--kafka-brokers", brokers, "--http-addr", "off"); code != 1 || !strings.Contains(stderr, "no handlers registered") {
		t.Fatalf("run without handlers: exit %d, %q", code, stderr)
	}

	addr := freeAddr(t)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- workercmd.Main(runCtx, []string{"run", "--database-url", db.URL, "--kafka-brokers", brokers,
			"--http-addr", addr, "--log-format", "json", "--prune-interval", "0"}, io.Discard, &stderr, register)
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
	if code != 0 || !strings.Contains(stdout, "1 redriven, 0 skipped") {
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
