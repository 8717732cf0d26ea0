package relay

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/internal/topicname"
)

// Defaults of Config.
const (
	SlotDefault                = "ferry"
	PublicationDefault         = "ferry"
	TopicTemplateDefault       = "outbox.event.{aggregate_type}"
	MaxInFlightRecordsDefault  = 10_000
	MaxInFlightBytesDefault    = 64 << 20
	StatusIntervalDefault      = time.Second
	StandbyPollDefault         = time.Second
	ServerTimeoutDefault       = 5 * time.Second
	ReconnectBackoffMaxDefault = 15 * time.Second
	ShutdownTimeoutDefault     = 30 * time.Second
	UnknownTopicWaitDefault    = 30 * time.Second
	HealthTimeoutDefault       = time.Minute
	WALMonitorIntervalDefault  = 10 * time.Second
	TopicConfigRefreshDefault  = time.Minute
	ReadWindowDefault          = 5 * time.Millisecond
	QuarantineOrderDefault     = QuarantineOrderSkip
)

// ReadWindowOff is a Config.ReadWindow that reads whatever arrives at once.
const ReadWindowOff time.Duration = -1

// QuarantineOrder says what happens to the later events of an aggregate
// one of whose events is quarantined (Config.QuarantineOrder).
type QuarantineOrder string

// Values of Config.QuarantineOrder.
const (
	// QuarantineOrderSkip quarantines an event Kafka refuses for good and
	// publishes the later events of its aggregate meanwhile: a requeued
	// event reaches consumers after them, out of order.
	QuarantineOrderSkip QuarantineOrder = "skip"
	// QuarantineOrderKeep quarantines the later events of an aggregate
	// behind its quarantined event (reason ReasonBehindQuarantined) until
	// that event is requeued or discarded, so that consumers see the
	// aggregate's events in order. An aggregate's next event then goes to
	// Kafka only once its previous one is acknowledged.
	QuarantineOrderKeep QuarantineOrder = "keep"
)

// Config configures a Relay. DatabaseURL and one of KafkaOpts, RabbitMQ
// and Sink are required.
type Config struct {
	// DatabaseURL is the PostgreSQL connection string. The relay opens one
	// ordinary connection (slot status, quarantine) and one replication
	// connection from it. The role needs REPLICATION and SELECT on outbox,
	// plus INSERT on outbox_quarantine; creating the publication needs
	// ownership of outbox (see NoCreate). Required.
	DatabaseURL string

	// Slot is the logical replication slot. Defaults to SlotDefault ("ferry").
	Slot string

	// Publication is the publication on the outbox table. Defaults to
	// PublicationDefault ("ferry").
	Publication string

	// NoCreate makes a missing slot or publication a start-up error instead
	// of creating it, for a least-privilege role whose administrator created
	// both. Defaults to false.
	NoCreate bool

	// TopicTemplate names each record's topic. "{aggregate_type}" and
	// "{event_type}" are replaced with the event's values. Defaults to
	// TopicTemplateDefault ("outbox.event.{aggregate_type}").
	TopicTemplate string

	// MaxInFlightRecords bounds the records a crash would publish again:
	// those of committed transactions not yet confirmed (acknowledged or
	// not, so a partition that stops acknowledging cannot let the window
	// grow behind it) plus the unacknowledged ones of the transaction being
	// read. The relay reads no further WAL while it is reached. After a
	// crash at most this many records, plus the rest of the transaction
	// being read, are published again. While a live migration writes both
	// channels, an event's two copies count once: the bound is in events,
	// and a crash publishes both copies again (MaxInFlightBytes counts
	// both). Defaults to MaxInFlightRecordsDefault (10,000).
	MaxInFlightRecords int

	// MaxInFlightBytes bounds the bytes of the same window, so that a large
	// transaction streams through bounded memory. Defaults to
	// MaxInFlightBytesDefault (64 MiB).
	MaxInFlightBytes int64

	// StatusInterval is how often the relay confirms its position to
	// PostgreSQL. Defaults to StatusIntervalDefault (1s); at most 10s.
	StatusInterval time.Duration

	// ReadWindow is how long, at most, the relay lets the replication
	// stream gather after a read that took everything the socket held,
	// before it reads again: at low rates the transactions that arrive
	// meanwhile are then read, decoded and sent to Kafka together (one
	// produce request), instead of each waking the relay, at a cost of up
	// to this much latency per event. It waits less when the stream comes
	// fast: as long as the stream takes, at its rate, to bring 32 KiB, so
	// that a backlog never fills the socket's buffer meanwhile; a read
	// that fills the buffer is followed at once. Defaults to
	// ReadWindowDefault (5ms); at most 100ms; ReadWindowOff reads whatever
	// arrives at once.
	ReadWindow time.Duration

	// KafkaLinger is how long the Kafka producer waits for more records
	// of a partition before it sends what it has (franz-go's
	// ProducerLinger). Zero, the default, sends at once: the read window
	// already batches, and the records of a read reach the producer
	// before it runs when the relay runs on one P (`relay run`'s
	// GOMAXPROCS default). On more Ps (a library user's relay, as a
	// rule) the producer may send the first records of a read before the
	// rest reach it, two or three requests where one would do; 1ms or
	// more gathers them. At most 1s.
	KafkaLinger time.Duration

	// ServerTimeout is how long silence on the replication connection is
	// tolerated, both ways. The relay sets it as the connection's
	// wal_sender_timeout, so PostgreSQL drops the walsender of a relay that
	// froze (a stopped process, a partitioned host) and a standby relay can
	// take the slot over; and the relay itself, which asks the server for a
	// keepalive with every status update, reconnects when nothing arrived
	// for this long (a frozen server, a dead network path) instead of
	// waiting for TCP. At least 3 × StatusInterval. Defaults to
	// ServerTimeoutDefault (5s).
	ServerTimeout time.Duration

	// StandbyPoll is how often a relay whose slot is held by another one
	// tries to take it over. Defaults to StandbyPollDefault (1s).
	StandbyPoll time.Duration

	// ReconnectBackoffMax caps the wait between reconnection attempts. The
	// first wait is 250ms; each failure in a row doubles it, up to this cap,
	// with random jitter of up to half the wait. Defaults to
	// ReconnectBackoffMaxDefault (15s).
	ReconnectBackoffMax time.Duration

	// UnknownTopicWait is how long the relay holds the records of a topic
	// that does not exist (and that the broker does not create) before it
	// quarantines them with reason "unknown_topic". Meanwhile the other
	// topics flow, the held records are retried in order and nothing is
	// confirmed past them; a topic created in time loses nothing. An
	// authorization failure is different: it is waited out for as long as
	// it lasts, with Ready reporting it. Defaults to UnknownTopicWaitDefault
	// (30s).
	UnknownTopicWait time.Duration

	// HealthTimeout is how long Run's loops may go without progress before
	// Healthy reports the relay wedged. Longer than StatusInterval,
	// StandbyPoll and ReconnectBackoffMax. Defaults to HealthTimeoutDefault
	// (1m).
	HealthTimeout time.Duration

	// ShutdownTimeout bounds how long Run waits, once its context ends, for
	// the current transaction to finish decoding and Kafka to acknowledge
	// what is in flight. Defaults to ShutdownTimeoutDefault (30s).
	ShutdownTimeout time.Duration

	// WALMonitorInterval is how often the slot's retained WAL and wal_status
	// are read. Defaults to WALMonitorIntervalDefault (10s).
	WALMonitorInterval time.Duration

	// TopicConfigRefresh is how long the relay trusts a topic's
	// max.message.bytes before reading it again; records above it are
	// quarantined without being sent. On RabbitMQ, how long it trusts a
	// probe that found an exchange writable (see RabbitMQConfig). Defaults
	// to TopicConfigRefreshDefault (1m).
	TopicConfigRefresh time.Duration

	// QuarantineOrder says what happens to the later events of an aggregate
	// one of whose events is quarantined: QuarantineOrderSkip publishes
	// them (the quarantined event, once requeued, arrives after them);
	// QuarantineOrderKeep quarantines them behind it until it is requeued
	// or discarded, at the cost of sending each aggregate's events one at a
	// time. Defaults to QuarantineOrderDefault ("skip").
	QuarantineOrder QuarantineOrder

	// KafkaOpts configure the franz-go producer: seed brokers, TLS, SASL.
	// The relay adds its own producer settings after them. Batches go
	// uncompressed unless they choose a codec (kgo.ProducerBatchCompression;
	// `relay run --kafka-compression`). Required unless Sink is set.
	KafkaOpts []kgo.Opt

	// RabbitMQ makes the relay publish to RabbitMQ instead of Kafka (see
	// RabbitMQConfig). It excludes KafkaOpts and Sink. Defaults to nil:
	// Kafka.
	RabbitMQ *RabbitMQConfig

	// Sink replaces the Kafka client built from KafkaOpts. The relay never
	// replaces a Sink it is given, not even after an abort of buffered
	// records was cut short (see Sink). Defaults to nil.
	Sink Sink

	// Logger receives the relay's logs. Defaults to a logger that discards.
	Logger *slog.Logger

	// Registerer receives the relay's metrics. Defaults to nil: no metrics
	// are registered.
	Registerer prometheus.Registerer

	// CloudEvents, when set, makes every record also a CloudEvent in the
	// binary mode of the CloudEvents Kafka protocol binding (see
	// CloudEvents). Defaults to nil: Ferry's headers only.
	CloudEvents *CloudEvents

	// TraceEvents makes a producer span per event ("send <topic>", with the
	// OpenTelemetry messaging attributes), a child of the trace context the
	// row's headers carry (outbox.Write records the writer's span there),
	// from the moment the relay publishes it until Kafka acknowledges it;
	// the record then carries the relay span's context, so the consumer's
	// span descends from it. Defaults to false: the row's trace headers go
	// to Kafka unchanged, and the trace goes from the writer straight to
	// the consumer.
	TraceEvents bool

	// TracerProvider and Propagator serve TraceEvents. Default to nil:
	// OpenTelemetry's global provider and propagator.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator

	// Prune, when set, makes Run delete outbox rows older than
	// Prune.Retention that the slot has confirmed, every Prune.Interval.
	// Defaults to nil: Run does not prune.
	Prune *PruneConfig

	// unsafeConfirmOnSend breaks "confirm only behind acks"
	// (lsn_tracker.go) on purpose: it confirms a transaction once its
	// records are handed to the producer, not when Kafka acknowledged them.
	// Only the negative control of the fault suite sets it, to prove the
	// checker sees the loss (UnsafeConfirmOnSend, ferryfault builds).
	unsafeConfirmOnSend bool

	// unsafeRabbitConfirmOnSend and unsafeNoMandatory are the RabbitMQ
	// sink's negative controls (unsafe_ferryfault.go): a record succeeds
	// once its publish is written, before the broker's confirmation; a
	// publish without mandatory, so that an unroutable message is
	// acknowledged and dropped.
	unsafeRabbitConfirmOnSend bool
	unsafeNoMandatory         bool

	// slotFault, set only by this package's tests (export_test.go), gives
	// the statement a recovery runs on its replication connection in place
	// of its attempt-th CREATE_REPLICATION_SLOT (attempts count from 1): a
	// real refusal from the server. "" runs the real command.
	slotFault func(attempt int) string

	// holdFlush, set only by this package's tests (export_test.go), is
	// the furthest position a status update confirms to PostgreSQL (0: no
	// limit), whatever the relay confirmed: the slot stays where a crash
	// before the next status update would leave it.
	holdFlush uint64

	// beforeStart, set only by this package's tests (export_test.go), runs
	// in each session between its first look at the slot and its
	// START_REPLICATION: where the last status update of a relay that lets
	// the slot go can still move it.
	beforeStart func()
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.Slot = cmp.Or(c.Slot, SlotDefault)
	c.Publication = cmp.Or(c.Publication, PublicationDefault)
	c.TopicTemplate = cmp.Or(c.TopicTemplate, TopicTemplateDefault)
	c.MaxInFlightRecords = cmp.Or(c.MaxInFlightRecords, MaxInFlightRecordsDefault)
	c.MaxInFlightBytes = cmp.Or(c.MaxInFlightBytes, MaxInFlightBytesDefault)
	c.StatusInterval = cmp.Or(c.StatusInterval, StatusIntervalDefault)
	c.StandbyPoll = cmp.Or(c.StandbyPoll, StandbyPollDefault)
	c.ServerTimeout = cmp.Or(c.ServerTimeout, ServerTimeoutDefault)
	c.ReconnectBackoffMax = cmp.Or(c.ReconnectBackoffMax, ReconnectBackoffMaxDefault)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, ShutdownTimeoutDefault)
	c.UnknownTopicWait = cmp.Or(c.UnknownTopicWait, UnknownTopicWaitDefault)
	c.HealthTimeout = cmp.Or(c.HealthTimeout, HealthTimeoutDefault)
	c.WALMonitorInterval = cmp.Or(c.WALMonitorInterval, WALMonitorIntervalDefault)
	c.TopicConfigRefresh = cmp.Or(c.TopicConfigRefresh, TopicConfigRefreshDefault)
	c.ReadWindow = cmp.Or(c.ReadWindow, ReadWindowDefault)
	c.QuarantineOrder = cmp.Or(c.QuarantineOrder, QuarantineOrderDefault)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Prune != nil {
		p := c.Prune.WithDefaults()
		c.Prune = &p
	}
	if c.RabbitMQ != nil {
		rc := c.RabbitMQ.withDefaults()
		c.RabbitMQ = &rc
	}
	return c
}

// PostgreSQL's rule for slot names; publications follow identifier rules and
// are quoted, but Ferry keeps both to the safe set.
var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// CheckName returns why Ferry refuses name as a replication slot or
// publication name, nil when it takes it: 1-63 lower-case letters, digits
// and underscores. Config, Setup, Prune and Status apply it; a command line
// applies it to its flags before it does anything. The error starts with
// the quoted name, for the caller to prefix with the setting.
func CheckName(name string) error {
	if !slotName.MatchString(name) {
		return fmt.Errorf("%q: use 1-63 lower-case letters, digits and underscores", name)
	}
	return nil
}

// checkName is CheckName with field, as the caller knows it, in the error.
func checkName(field, name string) error {
	if err := CheckName(name); err != nil {
		return fmt.Errorf("relay: %s %w", field, err)
	}
	return nil
}

func (c Config) validate() error {
	if c.DatabaseURL == "" {
		return errors.New("relay: Config.DatabaseURL is required")
	}
	if err := checkName("Config.Slot", c.Slot); err != nil {
		return err
	}
	if err := checkName("Config.Publication", c.Publication); err != nil {
		return err
	}
	if err := checkTopicTemplate(c.TopicTemplate); err != nil {
		return err
	}
	if err := c.CloudEvents.validate(); err != nil {
		return err
	}
	// Sink with KafkaOpts stays allowed, as it always was (the Sink wins):
	// RabbitMQ excludes both.
	switch {
	case c.RabbitMQ != nil && len(c.KafkaOpts) > 0:
		return errors.New("relay: Config.RabbitMQ and Config.KafkaOpts exclude each other: give one channel")
	case c.RabbitMQ != nil && c.Sink != nil:
		return errors.New("relay: Config.RabbitMQ and Config.Sink exclude each other: give one channel")
	case c.RabbitMQ != nil:
		if err := c.RabbitMQ.validate(); err != nil {
			return err
		}
	case c.Sink == nil && len(c.KafkaOpts) == 0:
		return errors.New("relay: Config.KafkaOpts is required (at least kgo.SeedBrokers) unless Config.RabbitMQ or Config.Sink is set")
	}
	switch {
	case c.MaxInFlightRecords < 1:
		return fmt.Errorf("relay: Config.MaxInFlightRecords is %d: must be at least 1", c.MaxInFlightRecords)
	case c.MaxInFlightRecords > 1_000_000:
		// The relay sizes queues by it up front: 2,000,000,000 asked for 80 GB.
		return fmt.Errorf("relay: Config.MaxInFlightRecords is %d: must be at most 1000000, since the relay allocates its queues for that many records at start", c.MaxInFlightRecords)
	case c.MaxInFlightBytes < 1:
		return fmt.Errorf("relay: Config.MaxInFlightBytes is %d: must be at least 1", c.MaxInFlightBytes)
	case c.StatusInterval <= 0 || c.StatusInterval > 10*time.Second:
		return fmt.Errorf("relay: Config.StatusInterval is %s: must be within (0, 10s] so PostgreSQL's wal_sender_timeout never fires", c.StatusInterval)
	case c.KafkaLinger < 0 || c.KafkaLinger > time.Second:
		return fmt.Errorf("relay: Config.KafkaLinger is %s: must be within [0, 1s]", c.KafkaLinger)
	case c.ReadWindow > 100*time.Millisecond || (c.ReadWindow < 0 && c.ReadWindow != ReadWindowOff):
		return fmt.Errorf("relay: Config.ReadWindow is %s: must be within (0, 100ms], or ReadWindowOff", c.ReadWindow)
	case c.ServerTimeout < 3*c.StatusInterval:
		return fmt.Errorf("relay: Config.ServerTimeout is %s: must be at least 3 × Config.StatusInterval (%s), so that status updates keep a healthy connection alive", c.ServerTimeout, 3*c.StatusInterval)
	case c.StandbyPoll <= 0:
		return fmt.Errorf("relay: Config.StandbyPoll is %s: must be positive", c.StandbyPoll)
	case c.ReconnectBackoffMax <= 0:
		return fmt.Errorf("relay: Config.ReconnectBackoffMax is %s: must be positive", c.ReconnectBackoffMax)
	case c.HealthTimeout <= max(c.StatusInterval, c.StandbyPoll, c.ReconnectBackoffMax):
		return fmt.Errorf("relay: Config.HealthTimeout is %s: must exceed StatusInterval, StandbyPoll and ReconnectBackoffMax (%s), which a healthy relay may spend between heartbeats",
			c.HealthTimeout, max(c.StatusInterval, c.StandbyPoll, c.ReconnectBackoffMax))
	case c.UnknownTopicWait <= 0:
		return fmt.Errorf("relay: Config.UnknownTopicWait is %s: must be positive", c.UnknownTopicWait)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("relay: Config.ShutdownTimeout is %s: must be positive", c.ShutdownTimeout)
	case c.TopicConfigRefresh <= 0:
		return fmt.Errorf("relay: Config.TopicConfigRefresh is %s: must be positive", c.TopicConfigRefresh)
	case c.WALMonitorInterval <= 0:
		return fmt.Errorf("relay: Config.WALMonitorInterval is %s: must be positive", c.WALMonitorInterval)
	case c.QuarantineOrder != QuarantineOrderSkip && c.QuarantineOrder != QuarantineOrderKeep:
		return fmt.Errorf("relay: Config.QuarantineOrder is %q: use %q or %q", c.QuarantineOrder, QuarantineOrderSkip, QuarantineOrderKeep)
	}
	if c.Prune != nil {
		return c.Prune.validate()
	}
	return nil
}

// checkTopicTemplate is the one check of an event topic template, which a
// migration plan's channels pass too (topicname.CheckTemplate).
func checkTopicTemplate(tmpl string) error {
	if err := topicname.CheckTemplate(tmpl); err != nil {
		return fmt.Errorf("relay: Config.TopicTemplate %w", err)
	}
	return nil
}

// deadLetterSuffix ends the workers' dead-letter topics, which the relay
// never writes into.
const deadLetterSuffix = topicname.DeadLetterSuffix

// topicProblem says why the relay will not write to topic s: "" when it
// may. Kafka's topic name rules, and no dead-letter topic.
func topicProblem(s string) string {
	switch {
	case !validTopic(s):
		return fmt.Sprintf("topic name %q is not valid in Kafka", s)
	case strings.HasSuffix(s, deadLetterSuffix):
		return fmt.Sprintf("topic %q is a dead-letter topic (ending in %s), which only workers write", s, deadLetterSuffix)
	}
	return ""
}

// validTopic applies Kafka's topic name rules.
func validTopic(s string) bool { return topicname.Valid(s) }
