package inbox

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the worker's Prometheus series plus atomic copies that Stats
// reads without a registry.
type metrics struct {
	processed        *prometheus.CounterVec
	duplicates       *prometheus.CounterVec
	retries          *prometheus.CounterVec
	deadLettered     *prometheus.CounterVec
	deadLetterErrors *prometheus.CounterVec
	databaseErrors   *prometheus.CounterVec
	commitErrors     *prometheus.CounterVec
	handlerSeconds   *prometheus.HistogramVec
	lag              *prometheus.GaugeVec
	assigned         *prometheus.GaugeVec
	pruned           *prometheus.CounterVec
	pruneRefused     *prometheus.CounterVec
	droppedParts     *prometheus.CounterVec
	pauses           *prometheus.CounterVec
	parked           *prometheus.CounterVec
	stuck            *prometheus.GaugeVec
	// RabbitMQ: deliveries the broker marked redelivered, shard queues the
	// worker created (they lack what was published before).
	redelivered   *prometheus.CounterVec
	queuesCreated *prometheus.CounterVec
	// A live migration: copies received by side and role, fences passed,
	// messages held for fences, duplicates blocked by side.
	migrationCopies     *prometheus.CounterVec
	migrationFences     *prometheus.CounterVec
	migrationHeld       *prometheus.CounterVec
	migrationDuplicates *prometheus.CounterVec
	migrationLateness   *prometheus.GaugeVec

	nProcessed          atomic.Int64
	nDuplicates         atomic.Int64
	nRetries            atomic.Int64
	nDeadLettered       atomic.Int64
	nDeadLetterErrors   atomic.Int64
	nDatabaseErrors     atomic.Int64
	nCommitErrors       atomic.Int64
	nRevoked            atomic.Int64
	nLost               atomic.Int64
	nBackoffInterrupted atomic.Int64
	nPauses             atomic.Int64
	nParked             atomic.Int64
	nRedelivered        atomic.Int64
	nQueuesCreated      atomic.Int64
}

func newMetrics(reg prometheus.Registerer) *metrics {
	ct := []string{"consumer", "topic"}
	m := &metrics{
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_messages_processed_total", Help: "Messages whose handler effect committed with their inbox row.",
		}, ct),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_duplicates_skipped_total", Help: "Messages already in the inbox: committed without calling the handler.",
		}, ct),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_retries_total", Help: "Handler failures that were retried after a backoff.",
		}, ct),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_dead_lettered_total", Help: "Messages written to a dead-letter topic, by reason.",
		}, []string{"consumer", "topic", "reason"}),
		deadLetterErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_dead_letter_errors_total", Help: "Failed attempts to write a dead letter (each is retried; none is dropped).",
		}, ct),
		databaseErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_database_errors_total", Help: "Transactions that failed because of the database rather than the handler (unreachable, deadlock, serialization failure); retried without limit.",
		}, ct),
		commitErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_offset_commit_errors_total", Help: "Kafka offset commits that failed (retried at the next interval).",
		}, []string{"consumer"}),
		handlerSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ferry_worker_handler_seconds",
			Help:    "Time spent in the handler per message.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, ct),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ferry_worker_consumer_lag", Help: "Records between the partition's high watermark and the first record not yet finished.",
		}, []string{"consumer", "topic", "partition"}),
		assigned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ferry_worker_assigned_partitions", Help: "Partitions this worker currently owns.",
		}, []string{"consumer"}),
		pauses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_fetch_pauses_total", Help: "Times a partition's fetching paused because it held MaxBufferedBytesPerPartition.",
		}, []string{"consumer"}),
		parked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_parked_total", Help: "Messages parked in inbox_parked: neither applied nor accepted as a dead letter by Kafka.",
		}, []string{"consumer", "topic", "reason"}),
		migrationCopies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_migration_copies_total", Help: "Stamped copies of a live migration received, by channel side (old, new) and role (authoritative: applied; shadow: compared only).",
		}, []string{"consumer", "side", "role"}),
		migrationFences: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_migration_fences_total", Help: "Migration fences passed (every record before them on their partition finished), by channel side.",
		}, []string{"consumer", "side"}),
		migrationHeld: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_migration_held_total", Help: "Authoritative copies held until the other channel's fences were passed, so that an aggregate's order holds across channels.",
		}, []string{"consumer"}),
		migrationDuplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_migration_duplicates_total", Help: "Authoritative copies of a live migration the inbox had applied already, by the side that brought them again.",
		}, []string{"consumer", "side"}),
		migrationLateness: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ferry_worker_migration_lateness_seconds", Help: "Delay between the two copies of an event of a live migration over the report window (the shadow report's figures): quantile 0.99 and 1 (the largest).",
		}, []string{"consumer", "plan", "quantile"}),
		stuck: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ferry_worker_stuck_partitions", Help: "Partitions that cannot move: a dead letter that Kafka or the database will not take yet is retried (readiness is red meanwhile).",
		}, []string{"consumer"}),
		redelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_redelivered_total", Help: "RabbitMQ deliveries marked redelivered (their earlier delivery was not acknowledged: a closed channel or a crash); the inbox absorbs the ones already applied.",
		}, ct),
		queuesCreated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_rabbitmq_queues_created_total", Help: "RabbitMQ shard queues this worker created because they did not exist: events published before that are not in them.",
		}, []string{"consumer"}),
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_pruned_rows_total", Help: "Rows deleted by retention.",
		}, []string{"table"}),
		droppedParts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_dropped_partitions_total", Help: "Partitions of a partitioned table dropped by retention.",
		}, []string{"table"}),
		pruneRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_worker_prune_refused_total", Help: "Prune passes that kept a consumer's whole inbox: its retention is below the dedupe window its live migration's copies require.",
		}, []string{"consumer"}),
	}
	if reg != nil {
		reg.MustRegister(m.processed, m.duplicates, m.retries, m.deadLettered, m.deadLetterErrors,
			m.databaseErrors, m.commitErrors, m.handlerSeconds, m.lag, m.assigned, m.pruned, m.pauses, m.parked, m.stuck,
			m.migrationCopies, m.migrationFences, m.migrationHeld, m.migrationDuplicates, m.migrationLateness, m.pruneRefused, m.droppedParts,
			m.redelivered, m.queuesCreated)
	}
	return m
}

// partitionMetrics are one partition's series, resolved once.
type partitionMetrics struct {
	m                *metrics
	consumer, topic  string
	partition        string
	processed        prometheus.Counter
	duplicates       prometheus.Counter
	retries          prometheus.Counter
	deadLetterErrors prometheus.Counter
	databaseErrors   prometheus.Counter
	handlerSeconds   prometheus.Observer
	lag              prometheus.Gauge
}

func (m *metrics) forPartition(consumer, topic string, partition int32) *partitionMetrics {
	p := strconv.Itoa(int(partition))
	return &partitionMetrics{
		m: m, consumer: consumer, topic: topic, partition: p,
		processed:        m.processed.WithLabelValues(consumer, topic),
		duplicates:       m.duplicates.WithLabelValues(consumer, topic),
		retries:          m.retries.WithLabelValues(consumer, topic),
		deadLetterErrors: m.deadLetterErrors.WithLabelValues(consumer, topic),
		databaseErrors:   m.databaseErrors.WithLabelValues(consumer, topic),
		handlerSeconds:   m.handlerSeconds.WithLabelValues(consumer, topic),
		lag:              m.lag.WithLabelValues(consumer, topic, p),
	}
}

func (pm *partitionMetrics) addProcessed(n int) {
	pm.processed.Add(float64(n))
	pm.m.nProcessed.Add(int64(n))
}

func (pm *partitionMetrics) addDuplicates(n int) {
	pm.duplicates.Add(float64(n))
	pm.m.nDuplicates.Add(int64(n))
}

func (pm *partitionMetrics) retry() {
	pm.retries.Inc()
	pm.m.nRetries.Add(1)
}

func (pm *partitionMetrics) deadLettered(reason string) {
	pm.m.deadLettered.WithLabelValues(pm.consumer, pm.topic, reason).Inc()
	pm.m.nDeadLettered.Add(1)
}

func (pm *partitionMetrics) parked(reason string) {
	pm.m.parked.WithLabelValues(pm.consumer, pm.topic, reason).Inc()
	pm.m.nParked.Add(1)
}

func (pm *partitionMetrics) deadLetterError() {
	pm.deadLetterErrors.Inc()
	pm.m.nDeadLetterErrors.Add(1)
}

func (pm *partitionMetrics) databaseError() {
	pm.databaseErrors.Inc()
	pm.m.nDatabaseErrors.Add(1)
}

// forget drops the partition's lag series when the partition leaves.
func (pm *partitionMetrics) forget() {
	pm.m.lag.DeleteLabelValues(pm.consumer, pm.topic, pm.partition)
}

// Stats are the worker's counters since it was created.
type Stats struct {
	Processed           int64 // messages applied (handler effect committed)
	Duplicates          int64 // messages skipped because the inbox already had them
	Retries             int64 // handler failures retried after a backoff
	DeadLettered        int64 // messages written to a dead-letter topic
	DeadLetterErrors    int64 // failed dead-letter writes (each retried)
	DatabaseErrors      int64 // transactions failed by the database (unreachable, deadlock, serialization failure), retried without limit
	CommitErrors        int64 // failed Kafka offset commits
	PartitionsRevoked   int64 // partitions given up in a rebalance
	PartitionsLost      int64 // partitions lost with the group membership
	BackoffsInterrupted int64 // retry waits cut short by a revoke or shutdown
	FetchPauses         int64 // partitions paused for holding too much fetched data
	Parked              int64 // messages parked in inbox_parked: neither applied nor dead-lettered
	Redelivered         int64 // RabbitMQ deliveries marked redelivered
	QueuesCreated       int64 // RabbitMQ shard queues the worker had to create
}

func (m *metrics) stats() Stats {
	return Stats{
		Processed:           m.nProcessed.Load(),
		Duplicates:          m.nDuplicates.Load(),
		Retries:             m.nRetries.Load(),
		DeadLettered:        m.nDeadLettered.Load(),
		DeadLetterErrors:    m.nDeadLetterErrors.Load(),
		DatabaseErrors:      m.nDatabaseErrors.Load(),
		CommitErrors:        m.nCommitErrors.Load(),
		PartitionsRevoked:   m.nRevoked.Load(),
		Parked:              m.nParked.Load(),
		PartitionsLost:      m.nLost.Load(),
		BackoffsInterrupted: m.nBackoffInterrupted.Load(),
		FetchPauses:         m.nPauses.Load(),
		Redelivered:         m.nRedelivered.Load(),
		QueuesCreated:       m.nQueuesCreated.Load(),
	}
}
