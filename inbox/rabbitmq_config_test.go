package inbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// A RabbitMQ configuration's errors name the field at fault, and Kafka and
// RabbitMQ exclude each other.
func TestRabbitMQConfigValidate(t *testing.T) {
	t.Parallel()
	ok := RabbitMQConfig{URL: "amqp://ferry@127.0.0.1:5672/ferry"}
	for name, c := range map[string]struct {
		edit func(c *Config)
		want string
	}{
		"both":           {func(c *Config) { c.KafkaOpts = []kgo.Opt{kgo.SeedBrokers("x:1")} }, "Config.KafkaOpts choose a Kafka cluster and Config.RabbitMQ is set"},
		"both, by SASL":  {func(c *Config) { c.KafkaOpts = []kgo.Opt{kgo.SASL(nil)} }, "Config.KafkaOpts choose a Kafka cluster"},
		"no url":         {func(c *Config) { c.RabbitMQ.URL = "" }, "Config.RabbitMQ.URL is required"},
		"password":       {func(c *Config) { c.RabbitMQ.URL = "amqp://u:secret@h:1/v" }, "Config.RabbitMQ.Password"},
		"scheme":         {func(c *Config) { c.RabbitMQ.URL = "http://h:1" }, "Config.RabbitMQ.URL: scheme"},
		"shards":         {func(c *Config) { c.RabbitMQ.Shards = 12 }, "Config.RabbitMQ.Shards"},
		"prefetch":       {func(c *Config) { c.RabbitMQ.Prefetch = 5000 }, "Config.RabbitMQ.Prefetch is 5000"},
		"delivery limit": {func(c *Config) { c.RabbitMQ.DeliveryLimit = -1 }, "Config.RabbitMQ.DeliveryLimit is -1"},
		"tls on amqp":    {func(c *Config) { c.RabbitMQ.TLSCAFile = "ca.pem" }, "need an amqps:// URL"},
	} {
		t.Run(name, func(t *testing.T) {
			r := ok
			cfg := &Config{DB: noDB{}, RabbitMQ: &r}
			c.edit(cfg)
			_, err := New(cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v, want an error saying %q", err, c.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
	r := ok
	w, err := New(&Config{DB: noDB{}, RabbitMQ: &r})
	if err != nil {
		t.Fatal(err)
	}
	// Client settings for a live migration's Kafka new channel are no
	// cluster of their own.
	rr := ok
	if _, err := New(&Config{DB: noDB{}, RabbitMQ: &rr, KafkaOpts: []kgo.Opt{kgo.SessionTimeout(7 * time.Second), kgo.ClientID("w")}}); err != nil {
		t.Errorf("New with RabbitMQ and client settings: %v", err)
	}
	if got := w.cfg.RabbitMQ; got.Shards != rabbitmq.ShardsDefault || got.Prefetch != RabbitMQPrefetchDefault || got.DeliveryLimit != rabbitmq.DeliveryLimitDefault {
		t.Errorf("defaults %+v", got)
	}
	if r.Shards != 0 {
		t.Error("New changed the caller's RabbitMQConfig")
	}
}

// noDB is a database a configuration test never reaches.
type noDB struct{}

func (noDB) Begin(context.Context) (pgx.Tx, error) { return nil, errors.New("no database") }
