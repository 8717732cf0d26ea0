package workercli_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
)

// No output of any worker command shows a secret: not its help (whose
// defaults come from the environment), not a usage error, not the logs or
// error of a run that cannot reach its database or broker.
func TestNoCommandShowsASecret(t *testing.T) {
	const dbSecret, saslSecret = "Db-s3cret-7731", "Sasl-s3cret-9902"
	url := "postgres://ferry:" + dbSecret + "@127.0.0.1:1/ferry?connect_timeout=1"
	t.Setenv("FERRY_DATABASE_URL", url)
	t.Setenv("FERRY_KAFKA_SASL_PASSWORD", saslSecret)
	t.Setenv("FERRY_KAFKA_BROKERS", "127.0.0.1:1")
	app := &workercli.App{Name: "w", Register: func(w *inbox.Worker) error {
		w.Handle("c", "t", func(context.Context, pgx.Tx, *inbox.Message) error { return nil })
		return nil
	}}
	commands := [][]string{
		{"run"}, {"status", "--consumers", "c"}, {"prune"}, {"migrate"}, {"migrate", "down"},
		{"dlq", "list", "--topic", "t.dlq"}, {"dlq", "redrive", "--topic", "t.dlq", "--all"},
		{"dlq", "parked", "list"}, {"dlq", "parked", "redrive", "--all"},
	}
	used := 0 // outputs that show the database was tried: the secrets reached the commands
	for _, cmd := range commands {
		for _, extra := range [][]string{{"-h"}, {"--no-such-flag"}, {"--database-url", url, "--kafka-sasl-mechanism", "SCRAM-SHA-256",
			"--kafka-sasl-username", "ferry", "--log-level", "debug"}, {"--database-url", "postgres://ferry:" + dbSecret + "@[::1"}} {
			args := append(append([]string{}, cmd...), extra...)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var out, errOut bytes.Buffer
			code := workercli.Main(ctx, args, &out, &errOut, app)
			cancel()
			all := out.String() + errOut.String()
			if strings.Contains(all, "127.0.0.1:1") {
				used++
			}
			for _, secret := range []string{dbSecret, saslSecret} {
				if strings.Contains(all, secret) {
					t.Errorf("worker %s (exit %d) shows a secret:\n%s", strings.Join(args, " "), code, all)
				}
			}
		}
	}
	if used == 0 {
		t.Fatal("no command named the database it tried: the test did not exercise the secrets")
	}
}
