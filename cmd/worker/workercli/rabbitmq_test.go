package workercli_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
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
