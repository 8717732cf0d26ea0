//go:build ferryfault

package relay

// UnsafeConfirmOnSend makes a relay confirm WAL positions as soon as records
// are handed to the producer, before Kafka acknowledged them. It breaks
// Ferry's central rule on purpose and loses events when the relay crashes:
// it exists only as the negative control of the fault-injection suite, which
// must see that loss, and only in builds with the ferryfault tag (the
// suite's), never in the public API or a release binary.
func UnsafeConfirmOnSend(cfg *Config) { cfg.unsafeConfirmOnSend = true }
