package ferrytest

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// NoSecretShown runs every command of a command line (main, the binary's
// name for messages) with known secrets, as an operator gives them: a
// database password and a SASL password in the environment and on the
// command line. Each command runs with -h, with a flag it does not have,
// against a database and broker that cannot be reached, and with a URL that
// does not parse. The test fails if stdout or stderr shows a secret, or if
// no command named the database it tried (the secrets never reached it).
// It sets environment variables, so its caller cannot run in parallel.
func NoSecretShown(t *testing.T, name string, main func(ctx context.Context, args []string, stdout, stderr io.Writer) int, commands [][]string) {
	t.Helper()
	const dbSecret, saslSecret = "Db-s3cret-7731", "Sasl-s3cret-9902"
	url := "postgres://ferry:" + dbSecret + "@127.0.0.1:1/ferry?connect_timeout=1"
	t.Setenv("FERRY_DATABASE_URL", url)
	t.Setenv("FERRY_KAFKA_SASL_PASSWORD", saslSecret)
	t.Setenv("FERRY_KAFKA_BROKERS", "127.0.0.1:1")
	variants := [][]string{
		{"-h"},
		{"--no-such-flag"},
		{"--database-url", url, "--kafka-sasl-mechanism", "SCRAM-SHA-256", "--kafka-sasl-username", "ferry", "--log-level", "debug"},
		{"--database-url", "postgres://ferry:" + dbSecret + "@[::1"},
	}
	used := 0 // outputs that name the database tried: the secrets reached the command
	for _, cmd := range commands {
		for _, extra := range variants {
			args := append(append([]string{}, cmd...), extra...)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var out, errOut bytes.Buffer
			code := main(ctx, args, &out, &errOut)
			cancel()
			all := out.String() + errOut.String()
			if strings.Contains(all, "127.0.0.1:1") {
				used++
			}
			for _, secret := range []string{dbSecret, saslSecret} {
				if strings.Contains(all, secret) {
					t.Errorf("%s %s (exit %d) shows a secret:\n%s", name, strings.Join(args, " "), code, all)
				}
			}
		}
	}
	if used == 0 {
		t.Fatal("no command named the database it tried: the test did not exercise the secrets")
	}
}
