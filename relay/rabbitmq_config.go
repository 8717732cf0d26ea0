package relay

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/ferryhq/ferry/internal/kafkaauth"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// Defaults of RabbitMQConfig.
const (
	RabbitMQShardsDefault          = rabbitmq.ShardsDefault
	RabbitMQChannelsDefault        = 4
	RabbitMQMaxMessageBytesDefault = rabbitmq.MaxMessageBytesDefault
)

// RabbitMQConfig makes the relay publish to RabbitMQ instead of Kafka
// (Config.RabbitMQ). Each topic is a durable direct exchange, which the
// relay never declares: the workers' `worker schema` declares it with the
// consumers' shard queues, and the relay's user needs only the write
// permission on the exchanges (for example ^outbox\..*). A missing
// exchange is held like a missing Kafka topic (Config.UnknownTopicWait),
// and so is a message no queue is bound for (quarantined as "unroutable").
type RabbitMQConfig struct {
	// URL is amqp://user@host:port/vhost or amqps://...; it carries no
	// password (Password does). Required.
	URL string

	// Password is the user's password. Never logged. Defaults to "".
	Password string

	// Vhost, when set, replaces the URL's vhost. Defaults to "": the URL's.
	Vhost string

	// TLSCAFile is a PEM file of the CAs that sign the broker's certificate
	// (amqps). Defaults to "": the system's.
	TLSCAFile string

	// TLSCertFile and TLSKeyFile are a PEM client certificate and its key
	// (amqps), both or neither. Default to "": none.
	TLSCertFile string
	TLSKeyFile  string

	// TLSSkipVerify does not verify the broker's certificate. Defaults to
	// false.
	TLSSkipVerify bool

	// Shards is the number of shards per topic: the routing key of an
	// event is its aggregate's shard, and every consumer has one queue per
	// shard. A power of two up to 128, the same for the relay and every
	// worker of the channel. Defaults to RabbitMQShardsDefault (16).
	Shards int

	// Channels is the number of publishing channels: shard s is published
	// on channel s mod Channels, so one shard's events leave in order.
	// Defaults to RabbitMQChannelsDefault (4).
	Channels int

	// MaxMessageBytes is the largest message (body plus headers) the relay
	// sends; a larger one is quarantined as "message_too_large" without
	// being sent. Set it to the broker's max_message_size: a message over
	// it would close the channel. Defaults to RabbitMQMaxMessageBytesDefault
	// (16 MiB, the default of RabbitMQ 4.x).
	MaxMessageBytes int

	// Consumers are consumers whose shard queues must exist before the
	// relay publishes to an exchange. A queue receives only what is
	// published after it exists, and the broker says nothing when another
	// consumer's queue took an event: without this, a consumer whose
	// queues are missing lets events pass by it unseen. An exchange that
	// lacks a queue of one of them is held, in order, for as long as it
	// lasts (never quarantined), with Ready naming the consumer and the
	// queue, until the queues are declared (`worker schema`). The check is
	// made with the exchange's probe (Config.TopicConfigRefresh), so a
	// queue deleted later is noticed within that time. Defaults to none:
	// the relay relies on returns alone (an event no queue at all is bound
	// for is held, then quarantined as "unroutable").
	Consumers []string
}

func (c RabbitMQConfig) withDefaults() RabbitMQConfig {
	c.Shards = cmp.Or(c.Shards, RabbitMQShardsDefault)
	c.Channels = cmp.Or(c.Channels, RabbitMQChannelsDefault)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, RabbitMQMaxMessageBytesDefault)
	return c
}

func (c *RabbitMQConfig) conn() rabbitmq.Conn {
	return rabbitmq.Conn{
		URL: c.URL, Password: c.Password, Vhost: c.Vhost, Name: "ferry-relay",
		TLS: kafkaauth.TLSFiles{CA: c.TLSCAFile, Cert: c.TLSCertFile, Key: c.TLSKeyFile, SkipVerify: c.TLSSkipVerify},
	}
}

// names are the fields' names in errors.
func (c *RabbitMQConfig) names() rabbitmq.Names {
	return rabbitmq.Names{
		URL: "Config.RabbitMQ.URL", Password: "Config.RabbitMQ.Password", Vhost: "Config.RabbitMQ.Vhost",
		CA: "Config.RabbitMQ.TLSCAFile", CertKey: "Config.RabbitMQ.TLSCertFile and Config.RabbitMQ.TLSKeyFile",
	}
}

func (c *RabbitMQConfig) validate() error {
	if c.URL == "" {
		return errors.New("relay: Config.RabbitMQ.URL is required")
	}
	conn := c.conn()
	if err := conn.Check(c.names()); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if err := rabbitmq.CheckShards(c.Shards); err != nil {
		return fmt.Errorf("relay: Config.RabbitMQ.Shards: %w", err)
	}
	if c.Channels < 1 || c.Channels > rabbitmq.MaxShards {
		return fmt.Errorf("relay: Config.RabbitMQ.Channels is %d: must be from 1 to %d", c.Channels, rabbitmq.MaxShards)
	}
	for _, consumer := range c.Consumers {
		t := rabbitmq.Topology{Consumer: consumer, Shards: c.Shards}
		if err := t.Check(); err != nil {
			return fmt.Errorf("relay: Config.RabbitMQ.Consumers %q: %w", consumer, err)
		}
	}
	if c.MaxMessageBytes < 1 {
		return fmt.Errorf("relay: Config.RabbitMQ.MaxMessageBytes is %d: must be positive", c.MaxMessageBytes)
	}
	return nil
}
