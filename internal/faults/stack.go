package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Stack is the scripts/stack instance the suite runs against and injects
// faults into: the one in FERRY_STACK_DIR (scripts/stack's default,
// /tmp/ferry-stack, when unset).
type Stack struct {
	Dir          string // FERRY_STACK_DIR, "" for scripts/stack's default
	Script       string // path of scripts/stack
	DatabaseURL  string // the stack's admin database
	Brokers      []string
	BrokersB     []string // cluster B, for the migration run; nil when the stack has none
	PGVersion    string
	KafkaVersion string

	// The stack's RabbitMQ node: its AMQP URL (user ferry, vhost ferry, no
	// password), the password, the management API and the version; empty
	// when the stack has none.
	RabbitMQURL, RabbitMQPassword, RabbitMQManagementURL, RabbitMQVersion string
}

// OpenStack finds scripts/stack above the working directory and reads the
// environment of the running stack from it. When FERRY_TEST_DATABASE_URL or
// FERRY_TEST_KAFKA_BROKERS are set they must name that same stack: the suite
// refuses to load one stack while it stops the broker of another.
func OpenStack(ctx context.Context) (*Stack, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	s := &Stack{Dir: os.Getenv("FERRY_STACK_DIR"), Script: filepath.Join(root, "scripts", "stack")}
	out, err := s.run(ctx, "env")
	if err != nil {
		return nil, fmt.Errorf("the stack is not up (start it with: eval \"$(scripts/stack up)\", or FERRY_STACK_DIR=/tmp/ferry-stack-faults scripts/stack up for a stack of its own): %w", err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if ok {
			env[k] = strings.Trim(v, "'")
		}
	}
	s.DatabaseURL = env["FERRY_TEST_DATABASE_URL"]
	s.Brokers = strings.Split(env["FERRY_TEST_KAFKA_BROKERS"], ",")
	s.PGVersion, s.KafkaVersion = env["FERRY_TEST_PG_VERSION"], env["FERRY_TEST_KAFKA_VERSION"]
	s.RabbitMQURL, s.RabbitMQPassword = env["FERRY_TEST_RABBITMQ_URL"], env["FERRY_TEST_RABBITMQ_PASSWORD"]
	s.RabbitMQManagementURL, s.RabbitMQVersion = env["FERRY_TEST_RABBITMQ_MANAGEMENT_URL"], env["FERRY_TEST_RABBITMQ_VERSION"]
	if b := env["FERRY_TEST_KAFKA_B_BROKERS"]; b != "" {
		s.BrokersB = strings.Split(b, ",")
	}
	if s.DatabaseURL == "" || s.Brokers[0] == "" {
		return nil, fmt.Errorf("scripts/stack env printed no database or brokers:\n%s", out)
	}
	if v := os.Getenv("FERRY_TEST_DATABASE_URL"); v != "" && v != s.DatabaseURL {
		return nil, fmt.Errorf("FERRY_TEST_DATABASE_URL (%s) is not the stack in FERRY_STACK_DIR=%q (%s): the suite would inject faults into one stack and load another; eval \"$(FERRY_STACK_DIR=... scripts/stack env)\"",
			redact(v), s.Dir, redact(s.DatabaseURL))
	}
	if v := os.Getenv("FERRY_TEST_KAFKA_BROKERS"); v != "" && v != strings.Join(s.Brokers, ",") {
		return nil, fmt.Errorf("FERRY_TEST_KAFKA_BROKERS (%s) is not the stack in FERRY_STACK_DIR=%q (%s)", v, s.Dir, strings.Join(s.Brokers, ","))
	}
	return s, nil
}

func redact(url string) string {
	if at := strings.LastIndex(url, "@"); at >= 0 {
		if i := strings.Index(url, "://"); i >= 0 && i < at {
			return url[:i+3] + "***" + url[at:]
		}
	}
	return url
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "scripts", "stack")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("scripts/stack not found above the working directory: run from the ferry repository")
		}
		dir = parent
	}
}

// run runs scripts/stack with args and returns its stdout; stderr goes into
// the error.
func (s *Stack) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, s.Script, args...)
	if s.Dir != "" {
		cmd.Env = append(os.Environ(), "FERRY_STACK_DIR="+s.Dir)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("scripts/stack %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// KafkaStop stops the broker (SIGTERM, SIGKILL after 20 s).
func (s *Stack) KafkaStop(ctx context.Context) error {
	_, err := s.run(ctx, "kafka-stop")
	return err
}

// KafkaStart starts the broker again and waits until it serves.
func (s *Stack) KafkaStart(ctx context.Context) error {
	_, err := s.run(ctx, "kafka-start")
	return err
}

// KafkaBStop stops cluster B's broker.
func (s *Stack) KafkaBStop(ctx context.Context) error {
	_, err := s.run(ctx, "kafka-b-stop")
	return err
}

// KafkaBStart starts cluster B's broker and waits until it serves.
func (s *Stack) KafkaBStart(ctx context.Context) error {
	_, err := s.run(ctx, "kafka-b-start")
	return err
}

// PGRestartImmediate is `pg_ctl restart -m immediate`: a crash and recovery.
func (s *Stack) PGRestartImmediate(ctx context.Context) error {
	_, err := s.run(ctx, "pg-restart", "immediate")
	return err
}

// ensureKafka starts the broker if a fault left it stopped (after an
// interrupted run).
func (s *Stack) ensureKafka() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _ = s.run(ctx, "kafka-start")
}

// RabbitMQStop stops the RabbitMQ node gracefully (rabbitmqctl stop;
// SIGKILL after 20 s).
func (s *Stack) RabbitMQStop(ctx context.Context) error {
	_, err := s.run(ctx, "rabbitmq-stop")
	return err
}

// RabbitMQStart starts the node again (same ports, same data) and waits
// until it serves.
func (s *Stack) RabbitMQStart(ctx context.Context) error {
	_, err := s.run(ctx, "rabbitmq-start")
	return err
}

// RabbitMQKill SIGKILLs the node (beam.smp and its process group).
func (s *Stack) RabbitMQKill(ctx context.Context) error {
	_, err := s.run(ctx, "rabbitmq-kill")
	return err
}

// RabbitMQFreeze SIGSTOPs the node's beam.smp.
func (s *Stack) RabbitMQFreeze(ctx context.Context) error {
	_, err := s.run(ctx, "rabbitmq-freeze")
	return err
}

// RabbitMQThaw SIGCONTs it.
func (s *Stack) RabbitMQThaw(ctx context.Context) error {
	_, err := s.run(ctx, "rabbitmq-thaw")
	return err
}

// RabbitMQCtl runs rabbitmqctl args against the node and returns its
// output.
func (s *Stack) RabbitMQCtl(ctx context.Context, args ...string) (string, error) {
	return s.run(ctx, append([]string{"rabbitmq-ctl"}, args...)...)
}

// ensureRabbitMQ thaws and starts the node if a fault left it frozen or
// stopped (after an interrupted run).
func (s *Stack) ensureRabbitMQ() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _ = s.run(ctx, "rabbitmq-thaw")
	_, _ = s.run(ctx, "rabbitmq-start")
}
