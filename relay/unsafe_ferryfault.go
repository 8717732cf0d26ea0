//go:build ferryfault

package relay

// UnsafeConfirmOnSend makes a relay confirm WAL positions as soon as records
// are handed to the producer, before Kafka acknowledged them. It breaks
// Ferry's central rule on purpose and loses events when the relay crashes:
// it exists only as the negative control of the fault-injection suite, which
// must see that loss, and only in builds with the ferryfault tag (the
// suite's), never in the public API or a release binary.
func UnsafeConfirmOnSend(cfg *Config) { cfg.unsafeConfirmOnSend = true }

// UnsafeRabbitMQConfirmOnSend is UnsafeConfirmOnSend for a relay that
// publishes to RabbitMQ: a record counts as acknowledged once its publish
// is written to the connection, before the broker's confirmation, so a
// broker that dies before storing it loses it. The negative control of the
// RabbitMQ fault suite, ferryfault builds only.
func UnsafeRabbitMQConfirmOnSend(cfg *Config) { cfg.unsafeRabbitConfirmOnSend = true }

// UnsafeRabbitMQNoMandatory publishes without mandatory: a message no
// queue is bound for is acknowledged by the broker and dropped, where the
// relay would otherwise hold it and then quarantine it. The negative
// control of the unroutable event, ferryfault builds only.
func UnsafeRabbitMQNoMandatory(cfg *Config) { cfg.unsafeNoMandatory = true }
