package inbox

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/ferryhq/ferry/internal/kafkaauth"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// Defaults of RabbitMQConfig.
const (
	// RabbitMQPrefetchDefault is the deliveries a shard queue's channel
	// holds unacknowledged: the in-flight bound of one shard, and what a
	// crash of the worker returns to the queue.
	RabbitMQPrefetchDefault = 128
	// RabbitMQPrefetchMax is the largest prefetch a quorum queue honours.
	RabbitMQPrefetchMax = 2000
)

// RabbitMQConfig makes a Worker consume RabbitMQ instead of Kafka: each
// consumer reads one quorum queue per (topic, shard), named
// TOPIC.SHARD@CONSUMER, with a single active consumer, as it would read a
// Kafka partition. A delivery is acknowledged only after its transaction
// committed, on the channel that delivered it; retries hold the delivery
// (never a requeue, which would reorder); dead letters go to the topic's
// TOPIC.dlx exchange and its TOPIC.dlq stream, with publisher confirms.
//
// A queue only receives what is published after it exists: declare the
// queues (`worker schema`, or the worker at start) before the relay
// publishes the events the consumer must see.
type RabbitMQConfig struct {
	// URL is amqp://user@host:port/vhost or amqps://...; it must not carry
	// the password. Required.
	URL string
	// Password is the user's password. It is never logged. Defaults to ""
	// (a broker that needs none).
	Password string
	// Vhost, when set, replaces the URL's vhost. Defaults to "": the URL's.
	Vhost string
	// TLSCAFile, TLSCertFile and TLSKeyFile are PEM files for amqps: the CAs
	// that sign the broker's certificate, and a client certificate and key
	// (both or neither). Defaults to "": the system's CAs, no client
	// certificate.
	TLSCAFile, TLSCertFile, TLSKeyFile string
	// SkipVerify accepts any broker certificate. Defaults to false.
	SkipVerify bool
	// Shards is the shard count of every topic: a power of two up to 128,
	// the same as the relay's. Defaults to rabbitmq.ShardsDefault (16).
	Shards int
	// Prefetch is the unacknowledged deliveries of one shard queue (basic.qos
	// per consumer), the in-flight bound of a shard: at most
	// RabbitMQPrefetchMax. Defaults to RabbitMQPrefetchDefault (128).
	Prefetch int
	// DeliveryLimit is the shard queues' x-delivery-limit: the failed
	// deliveries (a worker that died or lost its connection holding the
	// message) after which the broker dead-letters a message to the
	// topic's .dlq stream itself. Defaults to rabbitmq.DeliveryLimitDefault
	// (50).
	DeliveryLimit int
	// NoCreate makes the worker only verify that its queues exist; missing
	// ones are a start-up error that names them. Defaults to false: the
	// worker declares what is missing, and warns that events published
	// before the queues existed are not in them.
	NoCreate bool
	// Name is the connections' name in the management UI. Defaults to
	// "ferry-worker".
	Name string
}

func (r RabbitMQConfig) withDefaults() RabbitMQConfig {
	r.Shards = cmp.Or(r.Shards, rabbitmq.ShardsDefault)
	r.Prefetch = cmp.Or(r.Prefetch, RabbitMQPrefetchDefault)
	r.DeliveryLimit = cmp.Or(r.DeliveryLimit, rabbitmq.DeliveryLimitDefault)
	r.Name = cmp.Or(r.Name, "ferry-worker")
	return r
}

// rabbitNames name RabbitMQConfig's fields in connection errors.
var rabbitNames = rabbitmq.Names{
	URL: "Config.RabbitMQ.URL", Password: "Config.RabbitMQ.Password", Vhost: "Config.RabbitMQ.Vhost",
	CA: "Config.RabbitMQ.TLSCAFile", CertKey: "Config.RabbitMQ.TLSCertFile and TLSKeyFile",
}

func (r *RabbitMQConfig) conn(suffix string) *rabbitmq.Conn {
	return &rabbitmq.Conn{
		URL: r.URL, Password: r.Password, Vhost: r.Vhost, Name: r.Name + suffix,
		TLS: kafkaauth.TLSFiles{CA: r.TLSCAFile, Cert: r.TLSCertFile, Key: r.TLSKeyFile, SkipVerify: r.SkipVerify},
	}
}

func (r *RabbitMQConfig) validate() error {
	if r.URL == "" {
		return errors.New("inbox: Config.RabbitMQ.URL is required")
	}
	if err := r.conn("").Check(rabbitNames); err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	if err := rabbitmq.CheckShards(r.Shards); err != nil {
		return fmt.Errorf("inbox: Config.RabbitMQ.Shards: %w", err)
	}
	if r.Prefetch < 1 || r.Prefetch > RabbitMQPrefetchMax {
		return fmt.Errorf("inbox: Config.RabbitMQ.Prefetch is %d: must be from 1 to %d (quorum queues cap it there)", r.Prefetch, RabbitMQPrefetchMax)
	}
	if r.DeliveryLimit < 1 {
		return fmt.Errorf("inbox: Config.RabbitMQ.DeliveryLimit is %d: must be at least 1", r.DeliveryLimit)
	}
	return nil
}
