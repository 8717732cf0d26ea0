package relaycli_test

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/cmd/relay/relaycli"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/outbox"
)

func needEnv(t *testing.T, env string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		t.Fatalf("%s is not set: run `eval \"$(scripts/stack up)\"` first", env)
	}
	return v
}

// relayUserURL is the stack's TLS (or plain) URL for the relay's
// least-privilege user, without a password.
func relayUserURL(t *testing.T, env string) string {
	t.Helper()
	u, err := url.Parse(needEnv(t, env))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(needEnv(t, ferrytest.EnvRabbitMQRelayUser))
	return u.String()
}

// The RabbitMQ settings are checked by name before anything connects: one
// channel, never both, and each value in its range.
func TestRelayRunRabbitMQSettingsAreValidatedByName(t *testing.T) {
	t.Setenv("FERRY_KAFKA_BROKERS", "")
	t.Setenv("FERRY_RABBITMQ_URL", "")
	db := "postgres://x@127.0.0.1:1/x"
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"--kafka-brokers", "h:1", "--rabbitmq-url", "amqp://u@h:5672/v"}, []string{"--kafka-brokers", "--rabbitmq-url", "exclude"}},
		{nil, []string{"--kafka-brokers", "--rabbitmq-url", "required"}},
		{[]string{"--rabbitmq-url", "amqp://u:secret@h:5672/v"}, []string{"--rabbitmq-url", "FERRY_RABBITMQ_PASSWORD"}},
		{[]string{"--rabbitmq-url", "http://h/"}, []string{"--rabbitmq-url", "scheme"}},
		{[]string{"--rabbitmq-url", "amqp://u@h:5672/v", "--rabbitmq-shards", "3"}, []string{"--rabbitmq-shards"}},
		{[]string{"--rabbitmq-url", "amqp://u@h:5672/v", "--rabbitmq-tls-ca-file", "/x"}, []string{"--rabbitmq-url", "amqps"}},
		{[]string{"--rabbitmq-url", "amqp://u@h:5672/v", "--rabbitmq-channels", "0"}, []string{"rabbitmq-channels"}},
		{[]string{"--rabbitmq-url", "amqp://u@h:5672/v", "--rabbitmq-channels", "200"}, []string{"--rabbitmq-channels (FERRY_RABBITMQ_CHANNELS)", "Config.RabbitMQ.Channels"}},
		{[]string{"--rabbitmq-url", "amqp://u@h:5672/v", "--rabbitmq-max-message-bytes", "-1"}, []string{"rabbitmq-max-message-bytes"}},
	}
	for _, c := range cases {
		args := append([]string{"run", "--database-url", db, "--http-addr", "off"}, c.args...)
		code, _, stderr := run(t, context.Background(), args...)
		for _, want := range c.want {
			if code != 2 || !strings.Contains(stderr, want) {
				t.Errorf("relay %v: exit %d, stderr %q; want exit 2 naming %s", args, code, stderr, want)
			}
		}
		if strings.Contains(stderr, "secret") {
			t.Errorf("relay %v shows the URL's password: %s", args, stderr)
		}
	}
}

// A wrong password or a broker certificate signed by an unknown CA stops
// `relay run` at start-up with an error that says what to fix, and never
// shows the password.
func TestRelayRunRefusedByRabbitMQ(t *testing.T) {
	db := ferrytest.NewMigratedDB(t)
	untrusted := ferrytest.UntrustedCA(t)
	cases := []struct {
		name     string
		args     []string
		password string
		want     []string
	}{
		{"wrong password", []string{"--rabbitmq-url", relayUserURL(t, ferrytest.EnvRabbitMQURL)}, "wrong-password-1234",
			[]string{"rabbitmq refused the connection", "wrong password (FERRY_RABBITMQ_PASSWORD)", `"` + needEnv(t, ferrytest.EnvRabbitMQRelayUser) + `"`}},
		{"untrusted CA", []string{"--rabbitmq-url", relayUserURL(t, ferrytest.EnvRabbitMQTLSURL), "--rabbitmq-tls-ca-file", untrusted},
			needEnv(t, ferrytest.EnvRabbitMQRelayPassword),
			[]string{"rabbitmq refused the connection", "not signed by a trusted CA", "--rabbitmq-tls-ca-file"}},
		{"no CA file", []string{"--rabbitmq-url", relayUserURL(t, ferrytest.EnvRabbitMQTLSURL)},
			needEnv(t, ferrytest.EnvRabbitMQRelayPassword),
			[]string{"rabbitmq refused the connection", "not signed by a trusted CA"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("FERRY_KAFKA_BROKERS", "")
			t.Setenv("FERRY_RABBITMQ_PASSWORD", c.password)
			ctx := ferrytest.Context(t, time.Minute) // a relay that retried instead would run until then
			code, _, stderr := run(t, ctx, append([]string{"run", "--database-url", db.URL, "--slot", "refused_" + ferrytest.Suffix(),
				"--http-addr", "off", "--log-format", "json", "--log-level", "debug"}, c.args...)...)
			if code != 1 {
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

// `relay run` publishes over TLS as the least-privilege relay user, with
// the password from the environment only: every event reaches a declared
// shard queue, the start-up log names the redacted URL, and no log line
// holds the password.
func TestRelayRunPublishesToRabbitMQOverTLS(t *testing.T) {
	ctx := ferrytest.Context(t, 2*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	aggregate := "rmq" + ferrytest.Suffix()
	topic := "outbox.event." + aggregate
	admin, err := amqp.Dial(ferrytest.RabbitMQURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ch, err := admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	topo := &rabbitmq.Topology{Consumer: "cli", Topics: []string{topic}, Shards: 4}
	if err := rabbitmq.Declare(ch, topo); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for s := range topo.Shards {
			_, _ = ch.QueueDelete(rabbitmq.QueueName(topic, s, "cli"), false, false, false)
		}
		_, _ = ch.QueueDelete(topic+rabbitmq.DeadLetterStreamSuffix, false, false, false)
		_ = ch.ExchangeDelete(topic, false, false)
		_ = ch.ExchangeDelete(topic+rabbitmq.DeadLetterExchangeSuffix, false, false)
	})
	slot := "rmq_" + ferrytest.Suffix()
	if code, out, stderr := run(t, ctx, "migrate", "--database-url", db.URL, "--slot", slot); code != 0 {
		t.Fatalf("relay migrate: exit %d\n%s\n%s", code, out, stderr)
	}

	password := needEnv(t, ferrytest.EnvRabbitMQRelayPassword)
	t.Setenv("FERRY_KAFKA_BROKERS", "")
	t.Setenv("FERRY_RABBITMQ_PASSWORD", password)
	tlsURL := relayUserURL(t, ferrytest.EnvRabbitMQTLSURL)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var logs ferrytest.Buffer
	done := make(chan int, 1)
	go func() {
		done <- relaycli.Main(runCtx, []string{"run", "--database-url", db.URL, "--slot", slot, "--http-addr", "off",
			"--log-format", "json", "--rabbitmq-url", tlsURL, "--rabbitmq-tls-ca-file", needEnv(t, ferrytest.EnvRabbitMQCAFile),
			"--rabbitmq-shards", "4", "--rabbitmq-channels", "2"}, io.Discard, &logs)
	}()

	var mu sync.Mutex
	got := map[string]int{}
	for s := range topo.Shards {
		cch, err := admin.Channel()
		if err != nil {
			t.Fatal(err)
		}
		ds, err := cch.Consume(rabbitmq.QueueName(topic, s, "cli"), "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for d := range ds {
				mu.Lock()
				got[d.MessageId]++
				mu.Unlock()
				_ = d.Ack(false)
			}
		}()
	}
	var ids []string
	for i := range 20 {
		written, err := outbox.Write(ctx, db.Pool, outbox.Event{AggregateType: aggregate, AggregateID: fmt.Sprint("a", i%5),
			EventType: "Changed", Payload: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, written[0].String())
	}
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		missing := 0
		for _, id := range ids {
			if got[id] == 0 {
				missing++
			}
		}
		mu.Unlock()
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events never reached RabbitMQ; relay logs:\n%s", missing, len(ids), logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("relay run exit %d:\n%s", code, logs.String())
	}
	out := logs.String()
	redacted := tlsURL // it has no password to redact
	if !strings.Contains(out, `"rabbitmq":"`+redacted) {
		t.Errorf("the start-up log does not name %s:\n%s", redacted, out)
	}
	if strings.Contains(out, password) {
		t.Errorf("the relay logged the password:\n%s", out)
	}
}
