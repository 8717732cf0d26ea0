// Package relay tails PostgreSQL's write-ahead log through logical
// replication (pgoutput) and publishes every committed outbox row to Kafka.
// It confirms a WAL position to PostgreSQL only once Kafka acknowledged
// every record before it, so a crash can repeat what was in flight but
// never lose an event; consumers that deduplicate on the id (package inbox)
// absorb the repeats.
//
// # Running it
//
// Setup creates the publication on the outbox table and the replication
// slot. The slot keeps every transaction that commits after it exists, so
// run Setup (or `relay migrate`) before the application writes its first
// event; Run creates what is missing too (unless Config.NoCreate), but
// misses what committed before it.
// Then:
//
//	err := relay.Setup(ctx, pool, relay.SlotDefault, relay.PublicationDefault, logger)
//	r, err := relay.New(&relay.Config{
//		DatabaseURL: url,
//		KafkaOpts:   []kgo.Opt{kgo.SeedBrokers(brokers...)},
//	})
//	err = r.Run(ctx) // until ctx ends; then drains, confirms and returns nil
//
// The command line does the same with flags or FERRY_* variables (`relay
// run -h` lists them):
//
//	relay migrate   # schema, publication and slot
//	relay run       # publish until SIGTERM
//	relay status    # the slot, its confirmed position and retained WAL, the quarantine
//
// A second relay on the same slot stands by (StateStandby) and takes the
// slot over, within Config.StandbyPoll, once the first one lets it go: when
// it stops or dies, or when PostgreSQL drops a frozen one after
// Config.ServerTimeout.
// Healthy, Ready and Active answer a liveness, a readiness and an "am I the
// active one" probe; Config.Registerer receives the metrics.
//
// # Configuration
//
// Config needs DatabaseURL and KafkaOpts (seed brokers, TLS, SASL: franz-go
// options, passed through) or a Sink of its own; every other field has a
// default, named in its doc and filled in by Config.WithDefaults. New checks the settings and its
// errors name the field; it connects to nothing. The server needs
// wal_level = logical and a replication slot and a WAL sender per relay;
// max_slot_wal_keep_size guards the disk against a relay that stays down,
// and track_commit_timestamp = on makes a recovery replay exactly in
// commit order. The relay's role needs REPLICATION, SELECT on outbox,
// INSERT on outbox_quarantine, SELECT, INSERT and UPDATE on
// ferry_relay_slot (what the slot confirmed, for a recovery), SELECT on
// ferry_migration and ferry_migration_step, and DELETE on outbox for
// retention; creating the publication needs ownership of outbox, which
// Config.NoCreate avoids once an administrator ran Setup.
//
// # What reaches Kafka
//
// Each outbox row becomes one record, produced idempotently with acks=all:
//
//	topic      Config.TopicTemplate, "outbox.event.{aggregate_type}" by default
//	key        the aggregate id: an aggregate's events share a partition, in commit order
//	value      the payload, byte for byte
//	headers    "id" (the outbox id, which consumers deduplicate on), "event_type",
//	           "aggregate_type", "aggregate_id", then the row's own headers
//	timestamp  the row's created_at
//
// Config.CloudEvents makes every record a CloudEvent as well.
//
// # Confirming behind the acknowledgements
//
// The relay confirms a transaction's commit position only once Kafka
// acknowledged every record of it and of every transaction before it. After
// a crash PostgreSQL resends from the last confirmed position: at most
// Config.MaxInFlightRecords records (and Config.MaxInFlightBytes bytes),
// plus the rest of the transaction being read, are published again. The relay reads no
// further WAL while that window is full, which also bounds its memory and
// the WAL a stuck partition makes PostgreSQL keep. A clean stop (Run's
// context ending) waits up to Config.ShutdownTimeout for the
// acknowledgements, confirms them and republishes nothing.
//
// # Quarantine
//
// An event Kafka refuses for good (larger than its topic's
// max.message.bytes, an invalid topic name, an invalid record, a topic that
// stays unknown for Config.UnknownTopicWait), or whose row uses a header
// name Ferry reserves, is written to outbox_quarantine with its reason and
// error, and the relay carries on.
// Quarantined lists those events; once the cause is fixed, Requeue moves
// them back into the outbox and the relay publishes them with their
// original ids; Discard deletes them for good (`relay quarantine list`,
// `requeue`, `discard`). With QuarantineOrderSkip
// (the default) an aggregate's later events are published meanwhile, so a
// requeued event arrives after them; with QuarantineOrderKeep they are
// quarantined behind it and go back with it, in order.
//
// # Failures
//
// A lost connection to PostgreSQL or Kafka is retried with capped backoff
// (Config.ReconnectBackoffMax), from the confirmed position, for as long as
// it lasts; meanwhile nothing new is confirmed. A topic whose credentials
// or ACL Kafka refuses is held and retried in place, in order, while the
// other topics flow. Run returns an error only for what a restart cannot
// cure, wrapping ErrFatal: wal_level not logical, the outbox, the
// publication or (with Config.NoCreate) the slot missing, a refused login
// or a database that does not exist, a privilege missing, or the slot gone
// or lost.
//
// # A lost slot
//
// The relay never creates a new slot in place of one it published from:
// the new slot would start at "now" and skip every event committed in
// between. When the slot is gone (a failover to a server without it, a
// restore, a drop: ErrSlotGone) or PostgreSQL invalidated it (ErrSlotLost),
// Run stops, and Relay.Recover (`relay recover`) creates a new slot and
// republishes the outbox rows created since a margin (RecoverOpts.Margin)
// before the last commit the old slot confirmed, which Ferry records in
// ferry_relay_slot, in commit order (exactly so with
// track_commit_timestamp on), before anything the new slot streams. It
// refuses when retention may have deleted part of that window
// (ErrGapNotRetained).
//
// # Retention
//
// Prune (or Config.Prune inside Run) deletes outbox rows older than the
// retention once the slot has confirmed them, so the outbox still holds
// what a lost slot would need republished; a day-partitioned outbox
// (schema.PartitionOutbox) is pruned by dropping whole days.
//
// # Migrations
//
// Ferry's tables come from its schema migrations (package migrate, `relay
// migrate`). A live move to another Kafka cluster or topic layout is
// planned with package migration: the relay reads each accepted step of
// the plan from the WAL, in the same stream as the outbox rows, and applies
// it at that exact point of the commit order. While it writes both
// channels, it confirms a position only once both acknowledged it. The
// relay needs no setting of its own for it (only its own Kafka clients:
// Config.Sink unset); the new channel's Kafka settings come from the plan,
// its SASL password from the environment variable the plan names.
package relay
