package workercli_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/outbox"
)

// rabbitEnv is a stack variable of the RabbitMQ node; the test fails
// without it.
func rabbitEnv(t *testing.T, env string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped with -short")
	}
	v := os.Getenv(env)
	if v == "" {
		t.Fatalf("%s is not set: run `make test`, or `eval \"$(scripts/stack up)\"` before go test", env)
	}
	return v
}

// When RabbitMQ refuses the connection (a wrong password, a certificate
// no configured CA signs), `run` says so at start-up, naming the setting
// to fix, exits 1, and never shows the password.
func TestRunRefusedByRabbitMQ(t *testing.T) {
	url := rabbitEnv(t, "FERRY_TEST_RABBITMQ_URL")
	tlsURL := rabbitEnv(t, "FERRY_TEST_RABBITMQ_TLS_URL")
	password := rabbitEnv(t, "FERRY_TEST_RABBITMQ_PASSWORD")
	db := ferrytest.NewMigratedDB(t)
	app := &workercli.App{Register: func(w *inbox.Worker) error {
		w.Handle("refused", "outbox.event.refused", func(context.Context, pgx.Tx, *inbox.Message) error { return nil })
		return nil
	}}
	cases := []struct {
		name, url, password string
		want                []string
	}{
		{"wrong password", url, "wrong-password-31", []string{"rabbitmq refused the connection", "wrong password (FERRY_RABBITMQ_PASSWORD)"}},
		{"untrusted certificate", tlsURL, password, []string{"rabbitmq refused the connection", "not signed by a trusted CA (set --rabbitmq-tls-ca-file)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("FERRY_RABBITMQ_PASSWORD", c.password)
			t.Setenv("FERRY_KAFKA_BROKERS", "")
			ctx := ferrytest.Context(t, time.Minute)
			code, _, stderr := run(ctx, app, "run", "--database-url", db.URL, "--http-addr", "off", "--rabbitmq-url", c.url)
			if code != 1 {
				t.Fatalf("exit %d, want 1:\n%s", code, stderr)
			}
			for _, want := range c.want {
				if !strings.Contains(stderr, want) {
					t.Errorf("the error does not say %q:\n%s", want, stderr)
				}
			}
			if strings.Contains(stderr, c.password) {
				t.Errorf("the password appears in the output:\n%s", stderr)
			}
		})
	}
}

// `schema` with --rabbitmq-url declares the consumers' shard queues, says
// loudly that the new ones hold nothing published before, declares nothing
// the second time, and --rabbitmq-no-create then verifies them; `dlq list`
// reads the (empty) dead-letter stream.
func TestSchemaDeclaresRabbitMQQueues(t *testing.T) {
	url := rabbitEnv(t, "FERRY_TEST_RABBITMQ_URL")
	t.Setenv("FERRY_RABBITMQ_PASSWORD", rabbitEnv(t, "FERRY_TEST_RABBITMQ_PASSWORD"))
	t.Setenv("FERRY_KAFKA_BROKERS", "")
	db := ferrytest.NewDB(t)
	consumer, topic := ferrytest.Name(t, "c"), "outbox.event."+ferrytest.Name(t, "t")
	app := &workercli.App{Register: func(w *inbox.Worker) error {
		w.Handle(consumer, topic, func(context.Context, pgx.Tx, *inbox.Message) error { return nil })
		return nil
	}}
	ctx := ferrytest.Context(t, time.Minute)
	args := []string{"schema", "--database-url", db.URL, "--rabbitmq-url", url, "--rabbitmq-shards", "2"}
	code, stdout, stderr := run(ctx, app, args...)
	if code != 0 || !strings.Contains(stdout, "2 shard queues each, 2 created") || !strings.Contains(stdout, "WARNING") {
		t.Fatalf("first schema: exit %d\n%s\n%s", code, stdout, stderr)
	}
	code, stdout, stderr = run(ctx, app, args...)
	if code != 0 || !strings.Contains(stdout, "0 created") || strings.Contains(stdout, "WARNING") {
		t.Fatalf("second schema: exit %d\n%s\n%s", code, stdout, stderr)
	}
	code, stdout, stderr = run(ctx, app, append(args, "--rabbitmq-no-create")...)
	if code != 0 {
		t.Fatalf("schema --rabbitmq-no-create: exit %d\n%s\n%s", code, stdout, stderr)
	}
	code, stdout, stderr = run(ctx, nil, "dlq", "list", "--rabbitmq-url", url, "--topic", topic+".dlq", "--rabbitmq-idle", "500ms")
	if code != 0 || !strings.Contains(stdout, "0 dead letters") {
		t.Fatalf("dlq list: exit %d\n%s\n%s", code, stdout, stderr)
	}
}

// `run --rabbitmq-url` consumes what the relay publishes to the shard
// queues `schema` declared, each message once, and exits 0 on SIGTERM (its
// context ending) with the queues empty; a prefetch a quorum queue cannot
// take is a usage error. `status --rabbitmq-url` shows the messages
// waiting in a consumer's queues before, its inbox rows after, and the
// queues a consumer never declared.
func TestRunConsumesRabbitMQ(t *testing.T) {
	url := rabbitEnv(t, "FERRY_TEST_RABBITMQ_URL")
	password := rabbitEnv(t, "FERRY_TEST_RABBITMQ_PASSWORD")
	t.Setenv("FERRY_RABBITMQ_PASSWORD", password)
	t.Setenv("FERRY_KAFKA_BROKERS", "")
	db := ferrytest.NewMigratedDB(t)
	consumer, topic := ferrytest.Name(t, "c"), "outbox.event."+ferrytest.Name(t, "t")
	var mu sync.Mutex
	seen := map[string]int{}
	app := &workercli.App{Register: func(w *inbox.Worker) error {
		w.Handle(consumer, topic, func(_ context.Context, _ pgx.Tx, m *inbox.Message) error {
			mu.Lock()
			seen[m.ID]++
			mu.Unlock()
			return nil
		})
		return nil
	}}
	ctx := ferrytest.Context(t, 2*time.Minute)
	common := []string{"--database-url", db.URL, "--rabbitmq-url", url, "--rabbitmq-shards", "2"}
	if code, stdout, stderr := run(ctx, app, append([]string{"schema"}, common...)...); code != 0 {
		t.Fatalf("schema: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if code, _, stderr := run(ctx, app, append([]string{"run", "--http-addr", "off", "--rabbitmq-prefetch", "5000"}, common...)...); code != 2 || !strings.Contains(stderr, "--rabbitmq-prefetch 5000") {
		t.Fatalf("prefetch 5000: exit %d\n%s", code, stderr)
	}
	// The queues exist with the default delivery limit, which RabbitMQ
	// cannot change: a worker told another one refuses to start, saying why.
	if code, _, stderr := run(ctx, app, append([]string{"run", "--http-addr", "off", "--rabbitmq-delivery-limit", "7"}, common...)...); code != 1 ||
		!strings.Contains(stderr, "exists with other arguments") || !strings.Contains(stderr, "x-delivery-limit") {
		t.Fatalf("another delivery limit: exit %d\n%s", code, stderr)
	}

	conn, err := amqp.DialConfig(strings.Replace(url, "amqp://ferry@", "amqp://ferry:"+password+"@", 1), amqp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		key := fmt.Sprintf("k%d", i%5)
		rk, p, err := rabbitmq.Publishing(&kgo.Record{Topic: topic, Key: []byte(key), Value: []byte("1"), Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderID, Value: fmt.Appendf(nil, "m-%d", i)}, {Key: outbox.HeaderAggregateID, Value: []byte(key)},
		}}, 2, "", rabbitmq.MaxMessageBytesDefault)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.PublishWithContext(ctx, topic, rk, true, false, p); err != nil {
			t.Fatal(err)
		}
	}

	statusArgs := []string{"status", "--database-url", db.URL, "--rabbitmq-url", url, "--rabbitmq-shards", "2",
		"--topics", topic, "--consumers", consumer + ",never-declared"}
	if code, _, stderr := run(ctx, nil, "status", "--database-url", db.URL, "--rabbitmq-url", url, "--consumers", consumer); code != 2 || !strings.Contains(stderr, "--topics is required") {
		t.Errorf("status without --topics: exit %d\n%s", code, stderr)
	}
	waitStatus(ctx, t, statusArgs, consumer, fmt.Sprintf("declared 0 %d (%s %d) 0 -", n, topic, n))
	waitStatus(ctx, t, statusArgs, "never-declared", "2 of 2 queues missing 0 - 0 -")

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	var stderr string
	go func() {
		code, o, e := run(runCtx, app, append([]string{"run", "--http-addr", "off", "--rabbitmq-prefetch", "8"}, common...)...)
		stderr = o + e
		done <- code
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		got := len(seen)
		mu.Unlock()
		if got == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("run: exit %d\n%s", code, stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if c := seen[fmt.Sprintf("m-%d", i)]; c != 1 {
			t.Errorf("m-%d handled %d times, want 1", i, c)
		}
	}
	if strings.Contains(stderr, password) {
		t.Error("the password appears in the logs")
	}
	waitStatus(ctx, t, statusArgs, consumer, fmt.Sprintf("declared 0 0 (%s 0) %d", topic, n))
	for s := range 2 {
		q, err := ch.QueueDeclarePassive(rabbitmq.QueueName(topic, s, consumer), true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages != 0 {
			t.Errorf("queue %s holds %d messages after the stop", q.Name, q.Messages)
		}
	}
}

// waitStatus runs `status` until the row of consumer, without its
// consumer name and its newest-applied time, reads want (a quorum queue
// counts a message once its log committed it).
func waitStatus(ctx context.Context, t *testing.T, args []string, consumer, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, stdout, stderr := run(ctx, nil, args...)
		var row string
		for line := range strings.Lines(stdout) {
			if f := strings.Fields(line); len(f) > 1 && f[0] == consumer {
				if !strings.HasSuffix(want, " -") && len(f) > 2 {
					f = f[:len(f)-1] // the newest applied time
				}
				row = strings.Join(f[1:], " ")
			}
		}
		if code == 0 && row == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status: exit %d, row of %s %q, want %q\n%s%s", code, consumer, row, want, stdout, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
