package inbox

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// TestMain has two roles. Started with FERRY_INBOX_CHILD set, the test
// binary is a worker process of its own (see child_test.go), which the
// crash tests SIGKILL. Otherwise it gives the examples, which have no
// *testing.T, a migrated database and a topic.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	flag.Parse()
	if testing.Short() {
		// Examples need PostgreSQL and Kafka; -short runs unit tests only.
		_ = flag.Set("test.skip", "^Example$")
		os.Exit(m.Run())
	}
	url, drop, err := ferrytest.MainDB("inbox_example")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	brokers := os.Getenv(ferrytest.EnvKafkaBrokers)
	topic := "inbox.example." + ferrytest.Suffix()
	deleteTopic, err := createTopic(brokers, topic)
	if err != nil {
		drop()
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("DATABASE_URL", url)
	os.Setenv("KAFKA_BROKERS", brokers)
	os.Setenv("EXAMPLE_TOPIC", topic)
	code := m.Run()
	deleteTopic()
	drop()
	os.Exit(code)
}

func createTopic(brokers, topic string) (func(), error) {
	if brokers == "" {
		return nil, fmt.Errorf("%s is not set: run `make test`, or `eval \"$(scripts/stack up)\"` before go test", ferrytest.EnvKafkaBrokers)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		return nil, err
	}
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adm.CreateTopic(ctx, 1, 1, nil, topic)
	if err == nil {
		err = res.Err
	}
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("create topic %s: %w", topic, err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topic)
		cl.Close()
	}, nil
}
