package relay_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// relayBin is the relay binary that process tests start and kill.
var relayBin string

// TestMain builds the relay binary for the process tests and gives the
// examples, which have no *testing.T, a migrated database, a slot name and
// topics of their own (see example_test.go).
func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		if testing.Short() {
			// Examples need PostgreSQL and Kafka; -short runs unit tests only.
			_ = flag.Set("test.skip", "^Example(|Setup|Requeue)$")
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "ferry-relay-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		relayBin = filepath.Join(dir, "relay")
		out, err := exec.Command("go", "build", "-o", relayBin, "github.com/ferryhq/ferry/cmd/relay").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build relay: %v\n%s", err, out)
			return 1
		}
		cleanup, err := exampleEnv()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer cleanup()
		return m.Run()
	}()
	os.Exit(code)
}

// exampleEnv sets what the examples read from the environment: a migrated
// database (DATABASE_URL), the brokers (KAFKA_BROKERS), a slot name
// (EXAMPLE_SLOT: slots are per server, and other packages' tests share it)
// and a topic template (EXAMPLE_TOPIC_TEMPLATE) whose topics "order" and
// "blob" exist, "blob" accepting records of at most 2 KiB.
func exampleEnv() (cleanup func(), err error) {
	url, drop, err := ferrytest.MainDB("relay_example")
	if err != nil {
		return nil, err
	}
	brokers := os.Getenv(ferrytest.EnvKafkaBrokers)
	if brokers == "" {
		drop()
		return nil, fmt.Errorf("%s is not set: run `make test`, or `eval \"$(scripts/stack up)\"` before go test", ferrytest.EnvKafkaBrokers)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		drop()
		return nil, err
	}
	adm := kadm.NewClient(cl)
	suffix := ferrytest.Suffix()
	prefix := "relay.example." + suffix
	topics := []string{prefix + ".order", prefix + ".blob"}
	cleanup = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topics...)
		cl.Close()
		drop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	limit := "2048"
	for _, c := range []struct {
		topic   string
		configs map[string]*string
	}{
		{topics[0], nil},
		{topics[1], map[string]*string{"max.message.bytes": &limit}},
	} {
		res, err := adm.CreateTopic(ctx, 1, 1, c.configs, c.topic)
		if err == nil {
			err = res.Err
		}
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("create topic %s: %w", c.topic, err)
		}
	}
	os.Setenv("DATABASE_URL", url)
	os.Setenv("KAFKA_BROKERS", brokers)
	os.Setenv("EXAMPLE_SLOT", "ferry_example_"+suffix)
	os.Setenv("EXAMPLE_TOPIC_TEMPLATE", prefix+".{aggregate_type}")
	return cleanup, nil
}
