package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/dbsqlc"
	tablepart "github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/pgerr"
	"github.com/ferryhq/ferry/outbox"
)

// Worker consumes Kafka topics for named consumers and applies each message
// exactly once per consumer through the inbox table. Register handlers with
// Handle, then call Run.
//
// Each consumer is one Kafka consumer group (the group id is the consumer
// name) and one namespace of the inbox: two consumers of one topic each
// apply every message once.
type Worker struct {
	cfg     Config
	metrics *metrics
	queries *dbsqlc.Queries
	tracing tracing
	// slots bounds the transactions in flight: a transaction holds a slot
	// index, and since[index] is when it began (0 when free), for Healthy.
	slots chan int
	since []atomic.Int64

	mu         sync.Mutex
	handlers   map[string]map[string]handling // consumer -> topic -> handler
	consumers  []string                       // in registration order
	middleware []Middleware
	started    bool

	running atomic.Bool
	groups  atomic.Pointer[[]*groupConsumer]

	// A live migration (migration.go): the groups consuming new channels,
	// the fences known passed, and what starts a group while running.
	routeMu   sync.Mutex
	followers map[followKey]*groupConsumer
	passed    map[fenceWait]int
	runCtx    context.Context
	runWG     sync.WaitGroup
	known     []*dbsqlc.FerryInboxChannel // read at start, by checkSchema
	shadows   *shadowWriter
	// marks are the partition ends the migration quarantine watches the
	// groups reach (migration_quarantine.go).
	marksMu sync.Mutex
	marks   map[positionKey]positionMark
	// unwatched counts, per consumer and plan, the partitions a quarantine
	// pass could not read the group's position on (Report.Unwatched).
	unwatched map[followKey]int64
	// shadowScans are, per consumer, where a quarantine pass reads the
	// shadows from (locateShadows): the quarantine loop's own.
	shadowScans map[string]shadowScan
	// shadowScanWarned: the consumers whose ferry_inbox_shadow_scan row
	// could not be read or written, said once each.
	shadowScanWarned sync.Map
	// reportWindows are, per consumer, the copies its shadow reports
	// count (migration_window.go): the report loop's own.
	reportWindows map[string]*reportWindow
	channelUp     map[channelKey]time.Time
	// oldWork is when each consumer last had work from its RabbitMQ old
	// channel (Report.OldWorkedAt).
	oldWork oldWork
	// deadLetterTail reads the own cluster's dead-letter topics during a
	// live migration (reportLoop).
	deadLetterTail *deadLetterTail
	dbOK           atomic.Int64 // unix nanos of PostgreSQL's last answer: a committed transaction or a ping (see reachability)
	// partitionedInbox: the inbox is partitioned by day (claim.go), read
	// at start by checkSchema.
	partitionedInbox bool
}

// New returns a Worker configured by cfg.
func New(cfg *Config) (*Worker, error) {
	if cfg == nil {
		return nil, errors.New("inbox: Config is required")
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	w := &Worker{
		cfg:           c,
		metrics:       newMetrics(c.Registerer),
		queries:       dbsqlc.New(),
		tracing:       newTracing(&c),
		slots:         make(chan int, c.Concurrency),
		since:         make([]atomic.Int64, c.Concurrency),
		handlers:      make(map[string]map[string]handling),
		followers:     map[followKey]*groupConsumer{},
		marks:         map[positionKey]positionMark{},
		unwatched:     map[followKey]int64{},
		shadowScans:   map[string]shadowScan{},
		reportWindows: map[string]*reportWindow{},
		channelUp:     map[channelKey]time.Time{},
		passed:        map[fenceWait]int{},
	}
	for i := range c.Concurrency {
		w.slots <- i
	}
	return w, nil
}

// Handle registers h for the messages of topic applied by consumer. A
// consumer may handle several topics; a topic may have several consumers.
// Handle panics on an empty name, a nil handler, a second handler for the
// same consumer and topic, or a call after Run started, as these are
// programming errors. A handler that locks rows other messages' effects
// lock too registers with HandleWith and HandleOpts.Locks.
func (w *Worker) Handle(consumer, topic string, h Handler) {
	w.HandleWith(consumer, topic, h, nil)
}

// HandleOpts are the options of one handler (Worker.HandleWith).
type HandleOpts struct {
	// Locks names the shared resources the handler locks for m: rows that
	// other messages' effects lock too, such as a product's stock or an
	// account's balance, as opposed to rows only m's effect touches. The
	// worker applies several messages in one transaction (Config.BatchSize)
	// and several transactions at once (Config.Concurrency), so a handler
	// that locks shared rows in the order its messages come makes two
	// batches wait for each other's rows, a deadlock PostgreSQL breaks only
	// after its deadlock_timeout (1 s by default) by aborting one of them.
	// With Locks, every transaction first takes a PostgreSQL advisory lock
	// on each resource its messages name, all in one order, before any
	// handler runs: transactions that share a resource take turns, never
	// a cycle. Name a resource the same way in every handler that locks it
	// ("stock:" + sku), in every consumer and worker of the database; a
	// resource a handler locks without naming it here escapes the order.
	// Return nil for a message that locks nothing shared, or that the
	// handler will refuse (undecodable). Locks must be quick and must not
	// touch the database; a panic fails the message's attempt as a
	// handler's would. Defaults to nil: no lock is taken.
	Locks func(m *Message) []string
}

// HandleWith is Handle with options; nil opts is Handle.
func (w *Worker) HandleWith(consumer, topic string, h Handler, opts *HandleOpts) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.started:
		panic("inbox: Handle called after Run")
	case consumer == "" || topic == "":
		panic("inbox: Handle needs a consumer name and a topic")
	case h == nil:
		panic(fmt.Sprintf("inbox: nil handler for consumer %q, topic %q", consumer, topic))
	}
	topics, ok := w.handlers[consumer]
	if !ok {
		topics = make(map[string]handling)
		w.handlers[consumer] = topics
		w.consumers = append(w.consumers, consumer)
	}
	if _, dup := topics[topic]; dup {
		panic(fmt.Sprintf("inbox: consumer %q already has a handler for topic %q", consumer, topic))
	}
	r := handling{handler: h}
	if opts != nil {
		r.locks = opts.Locks
	}
	topics[topic] = r
}

// handling is what HandleWith registered for one consumer and topic.
type handling struct {
	handler Handler
	locks   func(*Message) []string
}

// Use adds middleware around every handler, registered before or after.
// The first middleware is the outermost.
func (w *Worker) Use(mw ...Middleware) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		panic("inbox: Use called after Run")
	}
	w.middleware = append(w.middleware, mw...)
}

// Consumers returns the registered consumer names, in registration order.
func (w *Worker) Consumers() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.consumers)
}

// Topics returns the topics registered for consumer, sorted.
func (w *Worker) Topics(consumer string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for t := range w.handlers[consumer] {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// Stats returns the worker's counters.
func (w *Worker) Stats() Stats { return w.metrics.stats() }

// Ready reports nil once every consumer of a running worker has joined its
// group, for a readiness probe.
func (w *Worker) Ready() error {
	if !w.running.Load() {
		return errors.New("worker is not running")
	}
	gs := w.groups.Load()
	if gs == nil {
		return errors.New("worker is starting")
	}
	for _, g := range *gs {
		if err := g.src.ready(); err != nil {
			return err
		}
		if err := g.stuck(); err != nil {
			return err
		}
		if silent := time.Since(time.Unix(0, g.brokerOK.Load())); silent > unreachableAfter {
			return fmt.Errorf("consumer %s: %s has not answered for %s (unreachable?)", g.name, g.src.broker(), silent.Round(time.Second))
		}
	}
	if _, ok := w.cfg.DB.(pinger); ok {
		if silent := time.Since(time.Unix(0, w.dbOK.Load())); silent > unreachableAfter {
			return fmt.Errorf("PostgreSQL has not answered for %s (unreachable?)", silent.Round(time.Second))
		}
	}
	return nil
}

// pinger is a Config.DB that can be asked whether PostgreSQL answers, as a
// *pgxpool.Pool can. A DB that cannot is judged by its transactions only.
type pinger interface {
	Ping(ctx context.Context) error
}

// dbAnswered records that PostgreSQL committed a transaction: no ping is
// needed while the worker is busy.
func (w *Worker) dbAnswered() { w.dbOK.Store(time.Now().UnixNano()) }

// pingInterval is how often a running worker asks Kafka and PostgreSQL
// whether they answer; unreachableAfter is how long without an answer makes
// it not ready. An idle worker learns nothing otherwise: its poll waits
// quietly and it runs no transaction.
const (
	pingInterval     = 5 * time.Second
	unreachableAfter = 3 * pingInterval
)

// reachability pings Kafka (each consumer's client) every pingInterval,
// and PostgreSQL when no transaction committed for as long and Config.DB
// can be pinged, until ctx ends, for Ready. The ping never begins a
// transaction on Config.DB, which may be the application's own wrapper.
func (w *Worker) reachability(ctx context.Context) {
	t := time.NewTicker(pingInterval)
	defer t.Stop()
	for {
		for _, g := range *w.groups.Load() {
			pctx, cancel := context.WithTimeout(ctx, pingInterval)
			if g.ping(pctx) == nil {
				g.brokerOK.Store(time.Now().UnixNano())
			}
			cancel()
		}
		if p, ok := w.cfg.DB.(pinger); ok && time.Since(time.Unix(0, w.dbOK.Load())) >= pingInterval {
			pctx, cancel := context.WithTimeout(ctx, pingInterval)
			if p.Ping(pctx) == nil {
				w.dbAnswered()
			}
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Healthy returns nil unless the worker is wedged, for a liveness probe: a
// transaction has been running for Config.HealthTimeout (a handler that
// ignores its context, a database call that never returns; a handler a
// drain had to abandon keeps its slot too), or a consumer's offset commits
// have not run for as long. An idle worker is healthy: its poll loops wait
// for records, its commit loops keep running. A restart cures what this
// reports; the messages concerned were not committed and come again.
func (w *Worker) Healthy() error {
	if !w.running.Load() {
		return nil
	}
	now := time.Now()
	for i := range w.since {
		if at := w.since[i].Load(); at != 0 && now.Sub(time.Unix(0, at)) > w.cfg.HealthTimeout {
			return fmt.Errorf("worker is wedged: a transaction has run for %s (handler timeout %s): "+
				"a handler that ignores its context or a database call that never returns",
				now.Sub(time.Unix(0, at)).Round(time.Second), w.cfg.HandlerTimeout)
		}
	}
	if gs := w.groups.Load(); gs != nil {
		for _, g := range *gs {
			if since := now.Sub(time.Unix(0, g.beat.Load())); since > w.cfg.HealthTimeout {
				return fmt.Errorf("worker is wedged: consumer %s has not run its offset commits for %s", g.name, since.Round(time.Second))
			}
		}
	}
	return nil
}

// Run consumes until ctx ends, then drains: it stops taking new messages,
// lets transactions in flight finish (up to Config.DrainTimeout), commits
// their offsets, leaves the groups and returns nil. It returns an error when
// the worker cannot start: nothing registered, the inbox table missing, a
// Kafka client that cannot be created.
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return errors.New("inbox: Run called twice")
	}
	w.started = true
	consumers := slices.Clone(w.consumers)
	w.mu.Unlock()

	if len(w.cfg.Consumers) > 0 {
		for _, c := range w.cfg.Consumers {
			if _, ok := w.handlers[c]; !ok {
				return fmt.Errorf("inbox: Config.Consumers names %q, which has no handler (registered: %v)", c, consumers)
			}
		}
		consumers = slices.Clone(w.cfg.Consumers)
	}
	if len(consumers) == 0 {
		return errors.New("inbox: no handlers registered: call Worker.Handle before Run")
	}
	if err := w.checkSchema(ctx, consumers); err != nil {
		return err
	}
	if w.cfg.RabbitMQ != nil {
		if err := w.declareRabbitMQ(ctx, consumers); err != nil {
			return err
		}
	}

	for _, name := range consumers {
		for t := range w.handlers[name] {
			if dlq := w.cfg.DeadLetterTopic(t); dlq == t || dlq == "" {
				return fmt.Errorf("inbox: Config.DeadLetterTopic(%q) is %q: a dead-letter topic must be another topic, or every failure would be consumed again", t, dlq)
			}
		}
	}
	var groups []*groupConsumer
	for _, name := range consumers {
		topics := make(map[string]handling, len(w.handlers[name]))
		for t, h := range w.handlers[name] {
			topics[t] = handling{handler: Chain(h.handler, w.middleware...), locks: h.locks}
		}
		if w.cfg.RabbitMQ != nil {
			groups = append(groups, newRabbitGroupConsumer(w, name, topics))
			continue
		}
		g, err := newGroupConsumer(w, name, topics, w.cfg.KafkaOpts)
		if err != nil {
			for _, g := range groups {
				g.close()
			}
			return err
		}
		groups = append(groups, g)
	}
	now := time.Now().UnixNano()
	for _, g := range groups {
		g.brokerOK.Store(now)
	}
	w.dbOK.Store(now)
	w.groups.Store(&groups)
	w.running.Store(true)
	defer w.running.Store(false)

	wg := &w.runWG
	w.routeMu.Lock()
	w.runCtx = ctx
	w.routeMu.Unlock()
	// Before the groups start: their first fetch may hold shadow copies,
	// which the partitions hand to w.shadows.
	w.shadows = newShadowWriter(w)
	for range shadowWriters {
		wg.Go(func() { w.shadows.run(ctx) })
	}
	wg.Go(func() { w.reachability(ctx) })
	for _, g := range groups {
		wg.Go(func() { g.run(ctx) })
	}
	if w.cfg.Prune != nil {
		wg.Go(func() { w.pruneLoop(ctx) })
	}
	w.followKnown()
	wg.Go(func() { w.reportLoop(ctx, groups) })
	wg.Go(func() { w.quarantineLoop(ctx, groups) })
	w.cfg.Logger.Info("worker running", slog.Any("consumers", consumers),
		slog.Int("concurrency", w.cfg.Concurrency), slog.Int("batch_size", w.cfg.BatchSize),
		slog.Int("key_concurrency", w.cfg.KeyConcurrency), slog.String("offset_reset", string(w.cfg.OffsetReset)))
	wg.Wait()
	st := w.Stats()
	w.cfg.Logger.Info("worker stopped", slog.Int64("processed", st.Processed), slog.Int64("duplicates", st.Duplicates),
		slog.Int64("retries", st.Retries), slog.Int64("dead_lettered", st.DeadLettered))
	return nil
}

// checkSchema fails early when the inbox table is missing, which would
// otherwise look like an endless database outage. A database that is not
// reachable yet (restarting, starting with the worker) is waited for.
func (w *Worker) checkSchema(ctx context.Context, consumers []string) error {
	for n := 1; ; n++ {
		err := w.checkSchemaOnce(ctx, consumers)
		if err == nil || errors.Is(err, ErrInboxMissing) || ctx.Err() != nil || !databaseUnreachable(nil, err) {
			return err
		}
		wait := backoff.Delay(n, w.cfg.RetryBackoff, w.cfg.RetryBackoffMax)
		w.cfg.Logger.Warn("database unreachable at start; retrying", slog.Duration("retry_in", wait), slog.String("error", err.Error()))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

func (w *Worker) checkSchemaOnce(ctx context.Context, consumers []string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tx, err := w.cfg.DB.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: connect to the database: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := w.queries.InboxExists(ctx, tx, dbsqlc.InboxExistsParams{}); err != nil {
		if pgerr.UndefinedTable(err) {
			return ErrInboxMissing
		}
		return fmt.Errorf("inbox: check the inbox table: %w", err)
	}
	if w.partitionedInbox, err = tablepart.IsPartitioned(ctx, tx, tablepart.Inbox); err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	if w.partitionedInbox {
		// A claim reads what committed while it waited for its lock.
		var iso string
		if err := tx.QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil {
			return fmt.Errorf("inbox: read the transaction isolation: %w", err)
		}
		if iso != "read committed" {
			return fmt.Errorf("%w, and the worker's transactions are %s (default_transaction_isolation of the database or the role): "+
				"a claim could not see a claim of the same message committed while it waited, and would apply it twice", ErrIsolation, iso)
		}
	}
	// The new channels of live migrations the consumers learned before
	// (migration.go), in the same transaction: one round trip at start.
	w.known = w.known[:0]
	for _, c := range consumers {
		rows, err := w.queries.InboxChannels(ctx, tx, c)
		if pgerr.UndefinedTable(err) {
			return fmt.Errorf("%w (ferry_inbox_channel, for live migrations)", ErrInboxMissing)
		}
		if err != nil {
			return fmt.Errorf("inbox: read the migration channels of consumer %s: %w", c, err)
		}
		w.known = append(w.known, rows...)
	}
	return nil
}

func (w *Worker) pruneLoop(ctx context.Context) {
	cfg := *w.cfg.Prune
	db := w.cfg.DB.(outbox.DBTX) // Config.validate made sure
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		res, err := prune(ctx, db, &cfg, w.metrics)
		if err != nil && ctx.Err() == nil {
			w.cfg.Logger.Error("prune failed", slog.String("error", err.Error()))
		} else if err == nil && res.Partitioned {
			w.cfg.Logger.Info("inbox partitions pruned", slog.Int("dropped", res.PartitionsDropped), slog.Int("created", res.PartitionsCreated),
				slog.Duration("retention", res.Retention))
			if res.DefaultHasRows {
				w.cfg.Logger.Warn("the inbox's default partition holds rows (a processed_at outside every day's partition), which retention never drops",
					slog.String("partition", tablepart.Inbox.DefaultName()))
			}
		} else if err == nil {
			w.cfg.Logger.Info("pruned", slog.Int64("inbox_rows", res.Deleted), slog.Int("batches", res.Batches),
				slog.Int64("copy_rows", res.CopiesDeleted))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// acquire takes a transaction slot; it gives up (-1, false) when stop ends
// first.
func (w *Worker) acquire(stop <-chan struct{}) (int, bool) {
	select {
	case i := <-w.slots:
		w.since[i].Store(time.Now().UnixNano())
		return i, true
	case <-stop:
		return -1, false
	}
}

func (w *Worker) release(slot int) {
	w.since[slot].Store(0)
	w.slots <- slot
}
