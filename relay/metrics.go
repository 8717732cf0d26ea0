package relay

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the relay's Prometheus series plus atomic copies that Stats
// reads without a registry.
type metrics struct {
	published    prometheus.Counter
	bytes        prometheus.Counter
	quarantined  *prometheus.CounterVec
	inFlight     prometheus.Gauge
	unconfirmed  prometheus.Gauge
	retainedWAL  prometheus.Gauge
	slotActive   prometheus.Gauge
	ready        prometheus.GaugeFunc
	confirmedLSN prometheus.Gauge
	commitToAck  prometheus.Histogram
	// The two halves of commitToAck, for the latency breakdown
	// (ferrybench latency): PostgreSQL to the relay, the relay to Kafka.
	commitToReceive prometheus.Histogram
	receiveToAck    prometheus.Histogram
	sessions        prometheus.Counter
	standby         prometheus.Gauge
	pruned          prometheus.Counter
	droppedParts    prometheus.Counter
	heldTopics      prometheus.Gauge
	// A live migration: the epoch of the step in effect, fences written,
	// and copies acknowledged per channel side and role.
	migrationEpoch prometheus.Gauge
	fences         prometheus.Counter
	copies         *prometheus.CounterVec
	// The RabbitMQ sink: nacks, returns (unroutable), and channel or
	// connection closes by the broker, by AMQP reply code.
	nacks         prometheus.Counter
	returns       prometheus.Counter
	channelCloses *prometheus.CounterVec
	// Where the wake-ups go: reads of the replication socket that returned
	// data, the stream's messages by kind, status updates sent, and Kafka
	// produce requests written (docs/benchmarks.md divides them by events).
	replReads       prometheus.Counter
	replMessages    *prometheus.CounterVec
	walMessages     prometheus.Counter // replMessages' wal
	keepalives      prometheus.Counter // and keepalive
	statusUpdates   prometheus.Counter
	produceRequests prometheus.Counter
	nPublished      atomic.Int64
	nQuarantined    atomic.Int64
	nSessions       atomic.Int64
	lastConfirmed   atomic.Uint64
}

// newMetrics registers the relay's series on reg (nil: none); ready is
// the readiness probe ferry_relay_ready reads at every scrape.
func newMetrics(reg prometheus.Registerer, ready func() error) *metrics {
	m := &metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferry_relay_events_published_total", Help: "Outbox events acknowledged by Kafka.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferry_relay_bytes_published_total", Help: "Payload bytes of the events acknowledged by Kafka.",
		}),
		quarantined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_relay_events_quarantined_total", Help: "Events Kafka refused for good, written to outbox_quarantine.",
		}, []string{"reason"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ferry_relay_in_flight_records", Help: "Records sent to Kafka and not yet acknowledged.",
		}),
		unconfirmed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ferry_relay_unconfirmed_records", Help: "Records a crash would publish again: those of committed transactions not yet confirmed, plus the unacknowledged ones of the transaction being read. Bounded by --max-in-flight.",
		}),
		retainedWAL: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ferry_relay_retained_wal_bytes", Help: "WAL the replication slot keeps from being recycled.",
		}),
		slotActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ferry_relay_slot_active", Help: "1 while a process holds the replication slot (this relay, or the active one when this one stands by), as pg_replication_slots.active says; read with the retained WAL.",
		}),
		ready: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ferry_relay_ready", Help: "1 while /readyz answers 200: streaming with Kafka taking every topic, or standing by; 0 while starting, reconnecting or stalled (/readyz says why).",
		}, func() float64 { return boolGauge(ready() == nil) }),
		confirmedLSN: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ferry_relay_confirmed_lsn", Help: "WAL position last confirmed to PostgreSQL, as a number.",
		}),
		commitToAck: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ferry_relay_commit_to_ack_seconds",
			Help:    "Time from the PostgreSQL commit of an event to Kafka's acknowledgement.",
			Buckets: latencyBuckets,
		}),
		commitToReceive: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ferry_relay_commit_to_receive_seconds",
			Help:    "Time from the PostgreSQL commit of a transaction to the relay's receipt of its commit message from the replication stream.",
			Buckets: latencyBuckets,
		}),
		receiveToAck: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ferry_relay_receive_to_ack_seconds",
			Help:    "Time from the relay's receipt of an event from the replication stream to Kafka's acknowledgement.",
			Buckets: latencyBuckets,
		}),
		sessions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferry_relay_sessions_total", Help: "Replication sessions started (the first one and every reconnection).",
		}),
		standby: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ferry_relay_standby", Help: "1 while another relay holds the slot and this one waits.",
		}),
		heldTopics: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ferry_relay_refused_topics", Help: "Topics Kafka refuses for now (unknown, not authorized) whose records the relay holds and retries in place.",
		}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferry_relay_outbox_pruned_rows_total", Help: "Confirmed outbox rows deleted by retention.",
		}),
		droppedParts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferry_relay_outbox_dropped_partitions_total", Help: "Partitions of a partitioned outbox dropped by retention, every row confirmed.",
		}),
		migrationEpoch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ferry_relay_migration_epoch", Help: "Epoch of the live migration step in effect (0: none).",
		}),
		fences: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferry_relay_migration_fences_total", Help: "Migration fence records written (one per partition of a topic, per step and session).",
		}),
		copies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_relay_migration_copies_total", Help: "Copies of events acknowledged during a live migration, by channel side (old, new) and role (authoritative, shadow).",
		}, []string{"side", "role"}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferry_relay_broker_nacks_total", Help: "Publishes RabbitMQ nacked (an internal error of a queue): each fails the session, which resends from the confirmed position.",
		}),
		returns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferry_relay_returns_total", Help: "Publishes RabbitMQ returned as unroutable (no queue bound for the routing key): held, then quarantined as unroutable.",
		}),
		channelCloses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_relay_channel_closes_total", Help: "RabbitMQ publishing channels and connections the broker closed, by AMQP reply code; each fails the session.",
		}, []string{"code"}),
		replReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferry_relay_replication_reads_total", Help: "Reads of the replication connection's socket that returned data; the stream's messages divided by them is how many each read brought.",
		}),
		replMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_relay_replication_messages_total", Help: "Messages of the replication stream, by kind: wal (XLogData: begin, insert, commit, relation) or keepalive.",
		}, []string{"kind"}),
		statusUpdates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferry_relay_status_updates_total", Help: "Standby status updates sent to PostgreSQL (the confirmed position).",
		}),
		produceRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferry_relay_kafka_produce_requests_total", Help: "Produce requests written to Kafka brokers, every channel's.",
		}),
	}
	m.walMessages, m.keepalives = m.replMessages.WithLabelValues("wal"), m.replMessages.WithLabelValues("keepalive")
	if reg != nil {
		reg.MustRegister(m.published, m.bytes, m.quarantined, m.inFlight, m.unconfirmed, m.retainedWAL, m.slotActive, m.ready,
			m.confirmedLSN, m.commitToAck, m.commitToReceive, m.receiveToAck, m.sessions, m.standby, m.pruned, m.droppedParts, m.heldTopics,
			m.migrationEpoch, m.fences, m.copies, m.nacks, m.returns, m.channelCloses,
			m.replReads, m.replMessages, m.statusUpdates, m.produceRequests)
	}
	return m
}

// boolGauge is a gauge's value for b: 1 or 0.
func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// latencyBuckets are the buckets of the latency histograms, fine where a
// healthy relay's figures lie (milliseconds).
var latencyBuckets = []float64{.0005, .001, .002, .003, .004, .005, .0075, .01, .015, .02, .03, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// Stats are the relay's counters since it started.
type Stats struct {
	Published    int64  // events acknowledged by Kafka (a republished event counts again)
	Quarantined  int64  // events written to outbox_quarantine
	Sessions     int64  // replication sessions started
	ConfirmedLSN uint64 // last position confirmed to PostgreSQL
}
