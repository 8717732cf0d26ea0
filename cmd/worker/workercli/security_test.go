package workercli_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// When Kafka refuses the connection's security, `run` says so at start-up,
// naming the cause and the settings to fix, and exits 1.
func TestRunRefusedByKafka(t *testing.T) {
	sec := ferrytest.Secure(t)
	db := ferrytest.NewMigratedDB(t)
	topic := ferrytest.Topic(t, 1)
	app := &workercli.App{Register: func(w *inbox.Worker) error {
		w.Handle("refused", topic, func(context.Context, pgx.Tx, *inbox.Message) error { return nil })
		return nil
	}}
	cases := []struct {
		name, caFile, password string
		want                   []string
	}{
		{"wrong password", sec.CAFile, "wrong-password",
			[]string{`SASL SCRAM-SHA-512 authentication as "` + sec.User + `" failed`, "FERRY_KAFKA_SASL_PASSWORD", "SASL_AUTHENTICATION_FAILED"}},
		{"untrusted certificate", ferrytest.UntrustedCA(t), sec.Password,
			[]string{"the broker's certificate is not trusted", "--kafka-tls-ca-file", "x509: certificate signed by unknown authority"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("FERRY_KAFKA_SASL_PASSWORD", c.password)
			ctx := ferrytest.Context(t, time.Minute) // a worker that retried instead would exit 0 when it ends
			code, _, stderr := run(ctx, app, "run", "--database-url", db.URL, "--http-addr", "off", "--log-level", "debug",
				"--kafka-brokers", sec.SASLSSLBrokers, "--kafka-tls", "--kafka-tls-ca-file", c.caFile,
				"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-username", sec.User)
			if code != 1 || !strings.Contains(stderr, "worker run: kafka refused the connection: ") {
				t.Fatalf("exit %d, want 1 and a refusal:\n%s", code, stderr)
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

// A worker that authenticates (SCRAM-SHA-256 over TLS) logs every SASL step
// at debug level, and neither its password nor the database's.
func TestRunNeverLogsThePassword(t *testing.T) {
	sec := ferrytest.Secure(t)
	db := ferrytest.NewMigratedDB(t)
	const dbSecret = "db-pass-5e1d"
	url := strings.Replace(db.URL, "ferry:ferry@", "ferry:"+dbSecret+"@", 1) // trust auth ignores it
	if url == db.URL {
		t.Fatalf("test URL %s has no password to replace", db.URL)
	}
	topic := ferrytest.Topic(t, 1)
	app := &workercli.App{Register: func(w *inbox.Worker) error {
		w.Handle("never-logged", topic, func(context.Context, pgx.Tx, *inbox.Message) error { return nil })
		return nil
	}}
	t.Setenv("FERRY_KAFKA_SASL_PASSWORD", sec.Password)
	ctx := ferrytest.Context(t, time.Minute)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	addr := freeAddr(t)
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- workercli.Main(runCtx, []string{"run", "--database-url", url, "--http-addr", addr, "--prune-interval", "0",
			"--log-format", "json", "--log-level", "debug",
			"--kafka-brokers", sec.SASLSSLBrokers, "--kafka-tls", "--kafka-tls-ca-file", sec.CAFile,
			"--kafka-sasl-mechanism", "SCRAM-SHA-256", "--kafka-sasl-username", sec.User}, io.Discard, &logs, app)
	}()
	get(t, ctx, "http://"+addr+"/readyz") // ready: the consumer joined its group through the listener
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("run exited %d after its context ended, want 0:\n%s", code, logs.String())
	}
	out := logs.String()
	if !strings.Contains(out, "beginning sasl authentication") || !strings.Contains(out, `"mechanism":"SCRAM-SHA-256"`) {
		t.Fatalf("the debug logs do not show the SASL authentication they are meant to cover:\n%s", out)
	}
	for _, secret := range []string{dbSecret, sec.Password} {
		if strings.Contains(out, secret) {
			t.Fatalf("a secret appears in the logs:\n%s", out)
		}
	}
}

// syncBuffer is a bytes.Buffer that the worker's goroutines may write to
// while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
