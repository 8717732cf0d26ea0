package relaycli_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/cmd/relay/relaycli"
	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

// The relay publishes and a worker applies through the broker's secure
// listeners only, with each way of authenticating the command lines offer:
// SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN over TLS (the stack's SASL_SSL
// listener), and a client certificate (its mutual TLS listener). Every event
// takes effect exactly once.
func TestSecureKafkaEndToEnd(t *testing.T) {
	sec := ferrytest.Secure(t)
	sasl := func(mechanism string) []string {
		return []string{"--kafka-brokers", sec.SASLSSLBrokers, "--kafka-tls", "--kafka-tls-ca-file", sec.CAFile,
			"--kafka-sasl-mechanism", mechanism, "--kafka-sasl-username", sec.User}
	}
	cases := []struct {
		name     string
		kafka    []string
		password string
	}{
		{"SCRAM-SHA-512", sasl("SCRAM-SHA-512"), sec.Password},
		{"SCRAM-SHA-256", sasl("SCRAM-SHA-256"), sec.Password},
		{"PLAIN", sasl("PLAIN"), sec.Password},
		{"mutual TLS", []string{"--kafka-brokers", sec.MTLSBrokers, "--kafka-tls", "--kafka-tls-ca-file", sec.CAFile,
			"--kafka-tls-cert-file", sec.ClientCertFile, "--kafka-tls-key-file", sec.ClientKeyFile}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("FERRY_KAFKA_SASL_PASSWORD", c.password)
			t.Setenv("FERRY_KAFKA_BROKERS", "") // the secure listener only, from the flags
			endToEnd(t, c.kafka)
		})
	}
}

// endToEnd runs `relay run` and a worker's `run` with the kafka flags, writes
// events, and waits until each has taken effect once.
func endToEnd(t *testing.T, kafka []string) {
	const events = 20
	ctx := ferrytest.Context(t, 2*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE applied (id text PRIMARY KEY, n int NOT NULL DEFAULT 1)`); err != nil {
		t.Fatal(err)
	}
	aggregate := "sec" + ferrytest.Suffix()
	topic := "outbox.event." + aggregate
	ferrytest.CreateTopic(t, topic, 2)

	// The slot first: events committed before it exists are not the relay's.
	slot := "sec_" + ferrytest.Suffix()
	if code, out, stderr := run(t, ctx, "migrate", "--database-url", db.URL, "--slot", slot); code != 0 {
		t.Fatalf("relay migrate: exit %d\n%s\n%s", code, out, stderr)
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var relayLogs, workerLogs ferrytest.Buffer
	relayDone, workerDone := make(chan int, 1), make(chan int, 1)
	go func() {
		relayDone <- relaycli.Main(runCtx, append([]string{"run", "--database-url", db.URL, "--slot", slot,
			"--http-addr", "off", "--log-format", "json"}, kafka...), io.Discard, &relayLogs)
	}()
	register := func(w *inbox.Worker) error {
		w.Handle("secure-e2e", topic, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
			// n counts repeats: the inbox must keep it at 1.
			_, err := tx.Exec(ctx, `INSERT INTO applied (id) VALUES ($1) ON CONFLICT (id) DO UPDATE SET n = applied.n + 1`, m.ID)
			return err
		})
		return nil
	}
	workerAddr := freeAddr(t)
	go func() {
		workerDone <- workercli.Main(runCtx, append([]string{"run", "--database-url", db.URL, "--http-addr", workerAddr,
			"--log-format", "json", "--prune-interval", "0"}, kafka...), io.Discard, &workerLogs, &workercli.App{Register: register})
	}()
	logs := func() string { return "relay:\n" + relayLogs.String() + "\nworker:\n" + workerLogs.String() }

	for i := range events {
		if _, err := outbox.Write(ctx, db.Pool, outbox.Event{AggregateType: aggregate, AggregateID: fmt.Sprint(i % 5),
			EventType: "Secured", Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	for {
		var rows, repeats int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(n - 1), 0) FROM applied`).Scan(&rows, &repeats); err != nil {
			t.Fatalf("count applied: %v\n%s", err, logs())
		}
		if repeats != 0 {
			t.Fatalf("%d effects applied more than once\n%s", repeats, logs())
		}
		if rows == events {
			break
		}
		select {
		case code := <-relayDone:
			t.Fatalf("relay run exited %d with %d of %d events applied\n%s", code, rows, events, logs())
		case code := <-workerDone:
			t.Fatalf("worker run exited %d with %d of %d events applied\n%s", code, rows, events, logs())
		case <-ctx.Done():
			t.Fatalf("%d of %d events applied in 2 minutes\n%s", rows, events, logs())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if status, body := get("http://" + workerAddr + "/readyz"); status != http.StatusOK {
		t.Errorf("worker /readyz: %d %s", status, body)
	}
	stop()
	if code := <-relayDone; code != 0 {
		t.Errorf("relay run exited %d after its context ended, want 0\n%s", code, logs())
	}
	if code := <-workerDone; code != 0 {
		t.Errorf("worker run exited %d after its context ended, want 0\n%s", code, logs())
	}
}

// When Kafka refuses the connection's security, `relay run` says so at
// start-up, naming the cause and the settings to fix, and exits 1, instead
// of retrying forever while /readyz says ok (what it did before the start-up
// check: the relay's client connects only once there is an event to
// publish).
func TestRelayRunRefusedByKafka(t *testing.T) {
	sec := ferrytest.Secure(t)
	db := ferrytest.NewMigratedDB(t)
	sasl := func(mechanism, user, caFile string) []string {
		out := []string{"--kafka-brokers", sec.SASLSSLBrokers, "--kafka-tls", "--kafka-sasl-mechanism", mechanism, "--kafka-sasl-username", user}
		if caFile != "" {
			out = append(out, "--kafka-tls-ca-file", caFile)
		}
		return out
	}
	cases := []struct {
		name     string
		kafka    []string
		password string
		want     []string
	}{
		{"wrong SCRAM-SHA-512 password", sasl("SCRAM-SHA-512", sec.User, sec.CAFile), "wrong-password",
			[]string{`SASL SCRAM-SHA-512 authentication as "` + sec.User + `" failed`, "FERRY_KAFKA_SASL_PASSWORD", "SASL_AUTHENTICATION_FAILED",
				"invalid credentials with SASL mechanism SCRAM-SHA-512"}},
		{"unknown SCRAM-SHA-256 user", sasl("SCRAM-SHA-256", "nobody", sec.CAFile), sec.Password,
			[]string{`SASL SCRAM-SHA-256 authentication as "nobody" failed`, "SASL_AUTHENTICATION_FAILED"}},
		{"wrong PLAIN password", sasl("PLAIN", sec.User, sec.CAFile), "wrong-password",
			[]string{"SASL PLAIN authentication", "SASL_AUTHENTICATION_FAILED", "Invalid username or password"}},
		{"no CA file: the system's CAs do not know the stack's", sasl("SCRAM-SHA-512", sec.User, ""), sec.Password,
			[]string{"the broker's certificate is not trusted", "--kafka-tls-ca-file", "x509: certificate signed by unknown authority"}},
		{"another CA", sasl("SCRAM-SHA-512", sec.User, ferrytest.UntrustedCA(t)), sec.Password,
			[]string{"the broker's certificate is not trusted", "x509: certificate signed by unknown authority"}},
		{"no client certificate for the mutual TLS listener", []string{"--kafka-brokers", sec.MTLSBrokers, "--kafka-tls", "--kafka-tls-ca-file", sec.CAFile}, "",
			[]string{"the broker refused the TLS handshake", "--kafka-tls-cert-file", "remote error: tls:"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("FERRY_KAFKA_SASL_PASSWORD", c.password)
			ctx := ferrytest.Context(t, time.Minute) // a relay that retried instead would exit 0 when it ends
			code, _, stderr := run(t, ctx, append([]string{"run", "--database-url", db.URL, "--slot", "refused_" + ferrytest.Suffix(),
				"--http-addr", "off", "--log-format", "json", "--log-level", "debug"}, c.kafka...)...)
			if code != 1 || !strings.Contains(stderr, "relay run: kafka refused the connection: ") {
				t.Fatalf("exit %d, want 1 and a refusal:\n%s", code, stderr)
			}
			for _, want := range c.want {
				if !strings.Contains(stderr, want) {
					t.Errorf("the error does not say %q:\n%s", want, stderr)
				}
			}
			if c.password != "" && strings.Contains(stderr, c.password) {
				t.Errorf("the password appears in the output:\n%s", stderr)
			}
		})
	}
}
