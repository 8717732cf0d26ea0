package ferrytest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Environment variables of the stack's RabbitMQ node, printed by
// `scripts/stack up` (see scripts/stack).
const (
	// EnvRabbitMQURL is amqp://ferry@127.0.0.1:PORT/ferry, without the
	// password (EnvRabbitMQPassword): RabbitMQURL puts it in.
	EnvRabbitMQURL      = "FERRY_TEST_RABBITMQ_URL"
	EnvRabbitMQPassword = "FERRY_TEST_RABBITMQ_PASSWORD"
	// EnvRabbitMQTLSURL is the same user and vhost on the TLS listener,
	// whose certificate (SAN 127.0.0.1 and localhost) EnvRabbitMQCAFile
	// signed.
	EnvRabbitMQTLSURL    = "FERRY_TEST_RABBITMQ_TLS_URL"
	EnvRabbitMQCAFile    = "FERRY_TEST_RABBITMQ_CA_FILE"
	EnvRabbitMQRelayUser = "FERRY_TEST_RABBITMQ_RELAY_USER"
	// EnvRabbitMQRelayPassword is the password of the relay's user, who may
	// only write to the exchanges outbox.* of the vhost ferry.
	EnvRabbitMQRelayPassword = "FERRY_TEST_RABBITMQ_RELAY_PASSWORD"
	EnvRabbitMQManagementURL = "FERRY_TEST_RABBITMQ_MANAGEMENT_URL"
	EnvRabbitMQNode          = "FERRY_TEST_RABBITMQ_NODE"
	EnvRabbitMQPIDFile       = "FERRY_TEST_RABBITMQ_PID_FILE"
	// EnvStackDir is the stack's state directory, which scripts/stack
	// rabbitmq-ctl must be given to reach this stack's node.
	EnvStackDir = "FERRY_STACK_DIR"
)

// needRabbitMQ is need with a hint for stacks made before RabbitMQ existed.
func needRabbitMQ(t testing.TB, env string) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("integration test: skipped with -short")
	}
	v := os.Getenv(env)
	if v == "" {
		t.Fatalf("%s is not set: run `make test`, or `eval \"$(scripts/stack up)\"` before go test "+
			"(a stack that is up without RabbitMQ gets it with `eval \"$(scripts/stack up)\"` again; "+
			"a FERRY_STACK_KAFKA=0 or FERRY_STACK_RABBITMQ=0 stack has none)", env)
	}
	return v
}

// withUser returns raw, an AMQP URL of the stack, with user and password.
func withUser(t testing.TB, env, user, password string) string {
	t.Helper()
	raw := needRabbitMQ(t, env)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s=%q: %v", env, raw, err)
	}
	if user == "" {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

// RabbitMQURL returns the AMQP URL of the stack's node for the user ferry
// (administrator of the vhost ferry) with the password in it:
// amqp://ferry:PASSWORD@127.0.0.1:PORT/ferry. Like every integration helper
// it skips with -short and fails without a stack.
func RabbitMQURL(t testing.TB) string {
	t.Helper()
	return withUser(t, EnvRabbitMQURL, "", needRabbitMQ(t, EnvRabbitMQPassword))
}

// RabbitMQTLSURL is RabbitMQURL on the TLS listener (amqps://); dial it
// with RabbitMQTLSConfig.
func RabbitMQTLSURL(t testing.TB) string {
	t.Helper()
	return withUser(t, EnvRabbitMQTLSURL, "", needRabbitMQ(t, EnvRabbitMQPassword))
}

// RabbitMQRelayURL returns the plain AMQP URL for the relay's
// least-privilege user: no configure, no read, write on outbox.* only.
func RabbitMQRelayURL(t testing.TB) string {
	t.Helper()
	user := needRabbitMQ(t, EnvRabbitMQRelayUser)
	return withUser(t, EnvRabbitMQURL, user, needRabbitMQ(t, EnvRabbitMQRelayPassword))
}

// RabbitMQTLSConfig trusts the stack's CA; the server's certificate is
// for 127.0.0.1 and localhost. It asks for no client certificate: the node
// does not want one.
func RabbitMQTLSConfig(t testing.TB) *tls.Config {
	t.Helper()
	file := needRabbitMQ(t, EnvRabbitMQCAFile)
	pem, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read %s: %v", EnvRabbitMQCAFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("%s=%s holds no PEM certificate", EnvRabbitMQCAFile, file)
	}
	return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// RabbitMQCtl runs rabbitmqctl ARGS against the stack's node (scripts/stack
// rabbitmq-ctl, with FERRY_STACK_DIR as the test has it) and returns its
// standard output; it fails the test when rabbitmqctl fails. Tests that stop
// or starve the node (set_vm_memory_high_watermark 0, close_all_connections)
// change what every other test sees: give them the "faults" build tag.
func RabbitMQCtl(t testing.TB, args ...string) string {
	t.Helper()
	needRabbitMQ(t, EnvRabbitMQNode)
	needRabbitMQ(t, EnvStackDir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(RepoRoot(t), "scripts", "stack"), append([]string{"rabbitmq-ctl"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/stack rabbitmq-ctl %s: %v\n%s%s", strings.Join(args, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.String()
}

// RabbitMQManagement calls the node's management HTTP API as the user
// ferry: method on path (such as "/api/queues/ferry/NAME"), with body, when
// not nil, as JSON. It returns the response body; a status other than 2xx
// is an error that holds the status and the body.
func RabbitMQManagement(t testing.TB, method, path string, body any) ([]byte, error) {
	t.Helper()
	base := needRabbitMQ(t, EnvRabbitMQManagementURL)
	password := needRabbitMQ(t, EnvRabbitMQPassword)
	u, err := url.Parse(needRabbitMQ(t, EnvRabbitMQURL))
	if err != nil {
		t.Fatalf("%s: %v", EnvRabbitMQURL, err)
	}
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("management %s %s: %w", method, path, err)
		}
		r = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(base, "/")+path, r)
	if err != nil {
		return nil, fmt.Errorf("management %s %s: %w", method, path, err)
	}
	req.SetBasicAuth(u.User.Username(), password)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("management %s %s: %w", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("management %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return b, fmt.Errorf("management %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	return b, nil
}
