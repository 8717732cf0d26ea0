package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/pgerr"
)

// State is what a relay is doing.
type State int32

// States of a Relay.
const (
	StateStarting  State = iota // connecting, checking the slot
	StateStreaming              // holding the slot and publishing
	StateStandby                // another relay holds the slot; waiting to take over
	StateRetrying               // lost PostgreSQL or Kafka; reconnecting
	StateStopped
)

func (s State) String() string {
	return [...]string{"starting", "streaming", "standby", "retrying", "stopped"}[s]
}

// Relay publishes committed outbox rows to Kafka. Create it with New and
// call Run.
type Relay struct {
	cfg Config
	// dbConfig is Config.DatabaseURL parsed once, by New; the pool and the
	// replication connection are copies of it.
	dbConfig *pgxpool.Config
	namer    *topicNamer
	tracing  *eventTracing // nil unless Config.TraceEvents
	metrics  *metrics
	queries  *dbsqlc.Queries
	state    atomic.Int32
	gate     atomic.Pointer[topicGate] // the streaming session's, for Ready
	running  atomic.Bool
	beat     atomic.Int64                // unix nanoseconds of the last heartbeat of Run's loops
	lastAck  atomic.Int64                // unix nanoseconds of Kafka's last answer to a record (or to a ping)
	pinging  atomic.Bool                 // the sink answers pings, so an idle relay knows Kafka answers
	blocker  atomic.Pointer[sinkBlocker] // the sink, when the broker can block it (RabbitMQ)

	// A live migration's new channels: a Kafka client per plan, kept
	// across sessions, and the streaming session's gate on it, for Ready.
	outsMu  sync.Mutex
	outs    map[string]closingSink
	newGate atomic.Pointer[topicGate]
	// fenceWait says why a session waits to fence a topic, for Ready.
	fenceWait atomic.Pointer[string]
}

// connectTimeoutDefault bounds a connection attempt when the URL sets no
// connect_timeout.
const connectTimeoutDefault = 10 * time.Second

// heartbeat records that Run's loops are making progress (see Healthy).
func (r *Relay) heartbeat() { r.heartbeatAt(time.Now()) }

// heartbeatAt is heartbeat with the time its caller just read.
func (r *Relay) heartbeatAt(now time.Time) { r.beat.Store(now.UnixNano()) }

// Healthy returns nil unless Run's loops are wedged: no heartbeat for
// Config.HealthTimeout. Every loop beats at least once per StatusInterval,
// StandbyPoll or reconnection backoff, whether streaming, standing by,
// waiting for Kafka or retrying, so only a loop stuck in a call that never
// returns fails it. For a liveness probe: restarting such a relay is safe.
func (r *Relay) Healthy() error {
	if !r.running.Load() {
		return nil
	}
	if since := time.Since(time.Unix(0, r.beat.Load())); since > r.cfg.HealthTimeout {
		return fmt.Errorf("relay is wedged: no progress for %s (state %s)", since.Round(time.Second), r.State())
	}
	return nil
}

// Active returns nil while this relay holds the slot and streams.
func (r *Relay) Active() error {
	if s := r.State(); s != StateStreaming {
		return fmt.Errorf("relay is %s", s)
	}
	return nil
}

// New validates cfg and returns a Relay. It connects to nothing yet.
func New(cfg *Config) (*Relay, error) {
	if cfg == nil {
		return nil, errors.New("relay: Config is nil")
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	dbConfig, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		// pgx's message can include the URL; name the field only.
		return nil, errors.New("relay: Config.DatabaseURL is not a valid PostgreSQL connection string")
	}
	dbConfig.ConnConfig.RuntimeParams["application_name"] = "ferry-relay"
	if dbConfig.ConnConfig.ConnectTimeout == 0 {
		// A server that accepts TCP but never answers must not hang a
		// connection attempt (and Healthy) for as long as TCP allows.
		dbConfig.ConnConfig.ConnectTimeout = connectTimeoutDefault
	}
	r := &Relay{
		cfg:      c,
		dbConfig: dbConfig,
		namer:    newTopicNamer(c.TopicTemplate),
		tracing:  newEventTracing(&c),
		queries:  dbsqlc.New(),
		outs:     map[string]closingSink{},
	}
	r.metrics = newMetrics(c.Registerer, r.Ready)
	return r, nil
}

// State reports what the relay is doing.
func (r *Relay) State() State { return State(r.state.Load()) }

// Ready returns nil while the relay does its job, for a readiness probe:
// it streams and Kafka takes every topic, or it stands by, ready to take
// the slot over (a rolling update waits for a new standby, never for it to
// become active). Starting, reconnecting, and streaming while Kafka refuses
// a topic for now (not authorized, unknown) are not ready; the error says
// why. Active tells the relay that holds the slot.
func (r *Relay) Ready() error {
	switch s := r.State(); s {
	case StateStandby:
		return nil
	case StateStreaming:
	default:
		return fmt.Errorf("relay is %s", s)
	}
	if why := r.fenceWait.Load(); why != nil {
		return fmt.Errorf("relay is streaming, but %s", *why)
	}
	if g := r.newGate.Load(); g != nil {
		if why := g.reason(); why != "" {
			return fmt.Errorf("relay is streaming, but the migration's new channel refuses for now: %s", why)
		}
	}
	if b := r.blocker.Load(); b != nil {
		if why := (*b).Blocked(); why != "" {
			return fmt.Errorf("relay is streaming, but %s", why)
		}
	}
	broker := r.broker()
	if g := r.gate.Load(); g != nil {
		if why := g.reason(); why != "" {
			return fmt.Errorf("relay is streaming, but %s refuses for now: %s", broker, why)
		}
		silent := time.Since(time.Unix(0, r.lastAck.Load()))
		if n := g.s.tracker.unacknowledged(); n > 0 && silent > kafkaStall(&r.cfg) {
			return fmt.Errorf("relay is streaming, but %s answered none of %d records in flight for %s (unreachable, or refusing the credentials?)",
				broker, n, silent.Round(time.Second))
		}
		if r.pinging.Load() && silent > kafkaStall(&r.cfg) {
			return fmt.Errorf("relay is streaming, but %s has not answered for %s (unreachable?): an event written now would wait",
				broker, silent.Round(time.Second))
		}
	}
	return nil
}

// broker names the relay's channel in messages: "Kafka" or "RabbitMQ".
func (r *Relay) broker() string {
	if r.cfg.RabbitMQ != nil {
		return "RabbitMQ"
	}
	return "Kafka"
}

// brokerLower is broker in lower case, for the start of a log message.
func (r *Relay) brokerLower() string {
	if r.cfg.RabbitMQ != nil {
		return "rabbitmq"
	}
	return "kafka"
}

// kafkaStall is how long records may wait for Kafka's answer before the
// relay reports itself not ready: three server timeouts.
func kafkaStall(c *Config) time.Duration { return 3 * c.ServerTimeout }

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	return Stats{
		Published:    r.metrics.nPublished.Load(),
		Quarantined:  r.metrics.nQuarantined.Load(),
		Sessions:     r.metrics.nSessions.Load(),
		ConfirmedLSN: r.metrics.lastConfirmed.Load(),
	}
}

// Run publishes until ctx ends, then finishes the transaction it is
// decoding, waits (up to Config.ShutdownTimeout) for Kafka to acknowledge
// what is in flight, confirms it and returns nil. Lost connections to
// PostgreSQL or Kafka are retried forever; Run returns an error only for
// conditions a restart cannot cure (see ErrFatal).
func (r *Relay) Run(ctx context.Context) error {
	r.heartbeat()
	r.running.Store(true)
	defer r.running.Store(false)
	defer r.state.Store(int32(StateStopped))
	log := r.cfg.Logger.With(slog.String("slot", r.cfg.Slot))

	pool, err := r.connect(ctx, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := prepare(ctx, pool, r.cfg.Slot, r.cfg.Publication, r.cfg.NoCreate, r.cfg.Logger); err != nil {
		return err
	}

	sink, closeSink, err := r.newSink(log)
	if err != nil {
		return err
	}
	defer closeSink()
	defer r.closeChannels()

	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	go r.monitorWAL(runCtx, pool, cancelRun, log)
	if b, ok := sink.(sinkBlocker); ok {
		r.blocker.Store(&b)
		defer r.blocker.Store(nil)
	}
	if p, ok := sink.(pinger); ok {
		r.pinging.Store(true)
		defer r.pinging.Store(false)
		go r.pingKafka(runCtx, p)
	}
	if r.cfg.Prune != nil {
		go r.pruneLoop(runCtx, pool, log)
	}

	retry := backoff.Sequence{Base: reconnectBackoff, Ceiling: r.cfg.ReconnectBackoffMax}
	standbyLogged := false
	for {
		r.heartbeat()
		started := time.Now()
		err := r.session(runCtx, pool, sink, log)
		if cause := context.Cause(runCtx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
			return cause // a fatal condition found by the WAL monitor
		}
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrFatal) {
			return err
		}
		if pgerr.InsufficientPrivilege(err) {
			// A GRANT missing (SELECT on outbox, the ferry_relay_slot
			// table): an administrator must act, a retry cannot.
			return fmt.Errorf("%w: the relay's role lacks a privilege (see docs/relay.md#least-privilege): %w", ErrFatal, err)
		}
		if errors.Is(err, errSlotBusy) {
			r.state.Store(int32(StateStandby))
			r.metrics.standby.Set(1)
			if !standbyLogged {
				log.Info("standby: another relay holds the slot; taking over when it stops", slog.String("holder", err.Error()))
				standbyLogged = true
			}
			if !sleep(ctx, r.cfg.StandbyPoll) {
				return nil
			}
			continue
		}
		standbyLogged = false
		r.metrics.standby.Set(0)
		r.state.Store(int32(StateRetrying))
		if time.Since(started) > time.Minute {
			retry.Reset()
		}
		wait := retry.Next()
		log.Warn("replication session ended; reconnecting", slog.String("error", err.Error()), slog.Duration("retry_in", wait))
		if !sleep(ctx, wait) {
			return nil
		}
	}
}

// reconnectBackoff is the first wait after a lost connection; each failure
// in a row doubles it, up to Config.ReconnectBackoffMax.
const reconnectBackoff = 250 * time.Millisecond

// connect opens the ordinary pool, retrying while PostgreSQL is unreachable
// but giving up at once on errors a retry cannot fix.
func (r *Relay) connect(ctx context.Context, log *slog.Logger) (*pgxpool.Pool, error) {
	pcfg := r.dbConfig.Copy()
	pcfg.MaxConns = 4
	retry := backoff.Sequence{Base: reconnectBackoff, Ceiling: r.cfg.ReconnectBackoffMax}
	for {
		r.heartbeat()
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err == nil {
			if err = pool.Ping(ctx); err == nil {
				return pool, nil
			}
			pool.Close()
		}
		if pgerr.ConnectRefused(err) {
			return nil, fmt.Errorf("%w: connect to PostgreSQL: %w", ErrFatal, err)
		}
		wait := retry.Next()
		log.Warn("cannot reach PostgreSQL; retrying", slog.String("error", err.Error()), slog.Duration("retry_in", wait))
		if !sleep(ctx, wait) {
			return nil, ctx.Err()
		}
	}
}

// producerOpts are the caller's Kafka options plus the relay's own:
// idempotent acks=all production (franz-go's default) that retries forever,
// into a buffer that never blocks.
func (r *Relay) producerOpts() []kgo.Opt {
	return append(uncompressedUnlessChosen(r.cfg.KafkaOpts), r.producerOptsOwn()...)
}

// uncompressedUnlessChosen is opts after no compression, which opts may
// replace with a codec: franz-go's own default is snappy, which at a few
// records per batch costs the broker more than it saves (see
// cli.CompressionDefault). Every Kafka channel the relay writes gets it.
func uncompressedUnlessChosen(opts []kgo.Opt) []kgo.Opt {
	return append([]kgo.Opt{kgo.ProducerBatchCompression(kgo.NoCompression())}, opts...)
}

// producerOptsOwn are the relay's own producer options, for every channel
// it writes; fences (route.go) go to the partition they name.
//
// The client's buffer has no bound of its own: a full one blocks Produce
// until Kafka acknowledges, and Produce runs in the replication loop, which
// must send PostgreSQL a status update within Config.ServerTimeout whatever
// Kafka does. The session's in-flight budget bounds what is buffered;
// beyond it only the fences before an event, one per partition of its
// topic.
func (r *Relay) producerOptsOwn() []kgo.Opt {
	return []kgo.Opt{
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.MaxBufferedRecords(math.MaxInt),
		kgo.ProducerLinger(r.cfg.KafkaLinger), // zero: none, the read window batches
		kgo.RecordPartitioner(fencePartitioner()),
		kgo.WithHooks(produceCounter{r.metrics.produceRequests}),
	}
}

// produceCounter counts the produce requests a client writes
// (ferry_relay_kafka_produce_requests_total).
type produceCounter struct{ c prometheus.Counter }

func (p produceCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == 0 && err == nil { // Produce
		p.c.Inc()
	}
}

// closeChannels closes the Kafka clients of migrations' new channels.
func (r *Relay) closeChannels() {
	r.outsMu.Lock()
	defer r.outsMu.Unlock()
	for name, ks := range r.outs {
		ks.Close()
		delete(r.outs, name)
	}
}

// pinger is a Sink that can ask Kafka whether it answers.
type pinger interface {
	Ping(ctx context.Context) error
}

// pingKafka asks Kafka for an answer whenever none came for a
// ServerTimeout (an idle relay produces nothing), so that Ready turns red
// while the broker is unreachable even with no event in flight.
func (r *Relay) pingKafka(ctx context.Context, p pinger) {
	t := time.NewTicker(r.cfg.ServerTimeout)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if time.Since(time.Unix(0, r.lastAck.Load())) < r.cfg.ServerTimeout {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, r.cfg.ServerTimeout)
		if p.Ping(pctx) == nil {
			r.lastAck.Store(time.Now().UnixNano())
		}
		cancel()
	}
}

// monitorWAL reads the slot's retained WAL and stops the relay, loudly, if
// PostgreSQL invalidates the slot.
func (r *Relay) monitorWAL(ctx context.Context, pool *pgxpool.Pool, stop context.CancelCauseFunc, log *slog.Logger) {
	t := time.NewTicker(r.cfg.WALMonitorInterval)
	defer t.Stop()
	for {
		st, err := Status(ctx, pool, r.cfg.Slot)
		if err == nil {
			r.metrics.retainedWAL.Set(float64(st.RetainedWALBytes))
			r.metrics.slotActive.Set(boolGauge(st.Active))
			if st.WALStatus == "lost" {
				err := slotLostError(r.cfg.Slot)
				log.Error("replication slot lost", slog.String("error", err.Error()))
				stop(err)
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// newSink returns the sink of the configured channel (Config.Sink when
// set, else RabbitMQ's or Kafka's) and what closes it.
func (r *Relay) newSink(log *slog.Logger) (Sink, func(), error) {
	switch {
	case r.cfg.Sink != nil:
		return r.cfg.Sink, func() {}, nil
	case r.cfg.RabbitMQ != nil:
		rs := newRabbitMQSink(r.cfg.RabbitMQ, &r.cfg, r.metrics, log)
		return rs, rs.Close, nil
	}
	ks, err := newKafkaSink(r.producerOpts(), r.cfg.TopicConfigRefresh, log)
	if err != nil {
		return nil, nil, fmt.Errorf("relay: kafka client: %w", err)
	}
	return ks, ks.Close, nil
}
