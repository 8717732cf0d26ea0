package relay_test

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/relay"
)

// New parses Config.DatabaseURL once; a URL pgx cannot parse is refused by
// field name, without repeating the URL and its password.
func TestNewRefusesAnInvalidURLWithoutLeakingIt(t *testing.T) {
	t.Parallel()
	cfg := relay.Config{
		DatabaseURL: "postgres://ferry:s3cret@localhost:notaport/ferry",
		KafkaOpts:   []kgo.Opt{kgo.SeedBrokers("localhost:9092")},
	}
	_, err := relay.New(&cfg)
	if err == nil || !strings.Contains(err.Error(), "Config.DatabaseURL") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("New = %v, want an error naming Config.DatabaseURL and not the password", err)
	}
}

// The replication connection is derived from the one parsed URL, so a
// pgxpool parameter in it (pool_max_conns) configures the pool and never
// reaches PostgreSQL as a startup parameter, which it would refuse.
func TestPoolParametersInTheURL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 1)
	cfg := b.cfg
	sep := "?"
	if strings.Contains(cfg.DatabaseURL, "?") {
		sep = "&"
	}
	cfg.DatabaseURL += sep + "pool_max_conns=2"
	b.start(t, cfg)
	ids := b.write(t, evt("order", "o", 1))
	consume(t, []string{topic}, ids, time.Minute, 0)
}

// A topic template whose every topic is a dead-letter topic (the workers'
// default suffix) is refused at start-up: the relay never writes into one.
func TestNewRefusesADeadLetterTopicTemplate(t *testing.T) {
	t.Parallel()
	for _, tmpl := range []string{"orders" + inbox.DeadLetterSuffixDefault, "outbox.{aggregate_type}" + inbox.DeadLetterSuffixDefault} {
		cfg := relay.Config{
			DatabaseURL:   "postgres://ferry@localhost/ferry",
			TopicTemplate: tmpl,
			KafkaOpts:     []kgo.Opt{kgo.SeedBrokers("localhost:9092")},
		}
		if _, err := relay.New(&cfg); err == nil || !strings.Contains(err.Error(), "dead-letter") || !strings.Contains(err.Error(), tmpl) {
			t.Errorf("New with TopicTemplate %q = %v, want an error naming it as dead-letter topics", tmpl, err)
		}
	}
}
