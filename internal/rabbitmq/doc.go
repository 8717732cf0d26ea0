// Package rabbitmq holds what the relay, the workers and the tools share
// about a RabbitMQ channel: the shard of an aggregate and its routing key,
// the topology (exchanges, shard queues, dead letters) with every queue
// argument explicit, the connection settings, and Ferry's headers as an
// AMQP table. Neither engine's logic lives here; each engine owns its side
// of the channel (relay/rabbitmq_sink.go, inbox's RabbitMQ source).
//
// The topology, per topic (a Kafka topic's name, for example
// outbox.event.order):
//
//	outbox.event.order                 durable direct exchange: the relay publishes here,
//	                                   routing key = shard ("000" to "127")
//	outbox.event.order.dlx             durable fanout exchange: dead letters, Ferry's and the broker's
//	outbox.event.order.dlq             stream bound to the .dlx: readable without consuming it
//	outbox.event.order.007@CONSUMER    one quorum queue per (consumer, shard), bound with
//	                                   key "007", single active consumer, dead letters to the .dlx
//
// A shard is the migration slice of the aggregate id modulo the shard
// count (a power of two up to 128), so a slice never spans two shards and
// the relay can name the shard of every event it publishes.
package rabbitmq
