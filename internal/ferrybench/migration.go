package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/migration"
)

// migrationOpts is what a live migration costs (issue 25's item 5): the
// relay's drain while it writes two channels against its drain to one,
// and a worker's rate in DUAL_WRITE (applying the old channel's copies,
// recording the new channel's shadows) against its rate on one channel,
// in turn, in the same run. The new channel is the stack's cluster B.
type migrationOpts struct {
	relayEvents int // backlog of each relay drain
	onePerTx    int // messages of the one-per-transaction worker samples
	batched     int // messages of the batched worker samples
	batch       int
	runs        int
	payload     int
	relayArgs   []string // more `relay run` flags of every drain
}

// migrationResult holds the rounds of each comparison.
type migrationResult struct {
	o                    migrationOpts
	single, dual, ratio  samples // relay events/s, paired per round
	singleCost, dualCost samples // relay µs of CPU per event
	singleBusy, dualBusy samples // the machine's share busy during the drain
	workers              []migrationWorkerResult
}

type migrationWorkerResult struct {
	batch, n           int
	oldOnly, dual      samples // msg/s
	ratio              samples // dual / oldOnly, paired per sample
	shadowsBehindApply samples // s the shadows' recording ended after the last apply
	// per message (workerCost): one channel, then two
	oldWorker, oldPostgres, oldWAL    samples
	dualWorker, dualPostgres, dualWAL samples
}

// brokersB are the stack's cluster B seed brokers.
func brokersB() ([]string, error) {
	v := os.Getenv(ferrytest.EnvKafkaBBrokers)
	if v == "" {
		return nil, fmt.Errorf("%s is not set: the migration benchmark writes its new channel to the stack's cluster B (scripts/stack kafka-b-start)", ferrytest.EnvKafkaBBrokers)
	}
	return strings.Split(v, ","), nil
}

func benchMigration(ctx context.Context, e *env, o migrationOpts) (*migrationResult, error) {
	bin, err := e.build("github.com/ferryhq/ferry/cmd/relay", "relay")
	if err != nil {
		return nil, err
	}
	b, err := brokersB()
	if err != nil {
		return nil, err
	}
	res := &migrationResult{o: o}
	if err := relayDualWriteRounds(ctx, e, bin, b, res); err != nil {
		return nil, fmt.Errorf("relay dual write: %w", err)
	}
	if err := workerDualWriteRounds(ctx, e, bin, b, res); err != nil {
		return nil, fmt.Errorf("worker in DUAL_WRITE: %w", err)
	}
	return res, nil
}

// migrationSetup is a drain setup with a migration plan from the stack's
// Kafka (the relay's own topic template) to cluster B, created in
// OLD_ONLY.
type migrationSetup struct {
	*drainSetup
	admB        *kadm.Client
	ctl         *migration.Controller
	plan        migration.Plan
	oldTemplate string
	phase       migration.Phase
}

func newMigrationSetup(ctx context.Context, e *env, brokersB []string, prefix string) (_ *migrationSetup, err error) {
	ds, err := newDrainSetup(ctx, e, prefix)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			ds.close()
		}
	}()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokersB...))
	if err != nil {
		return nil, err
	}
	ds.cleanups = append(ds.cleanups, cl.Close)
	suffix := ferrytest.Suffix()
	m := &migrationSetup{drainSetup: ds, admB: kadm.NewClient(cl), ctl: &migration.Controller{DB: ds.pool},
		oldTemplate: "bench." + suffix + ".old.{aggregate_type}", phase: migration.OldOnly}
	m.plan = migration.Plan{Name: "bench-" + suffix, Groups: []string{"bench"},
		Old: migration.Channel{Brokers: e.brokers, TopicTemplate: m.oldTemplate},
		New: migration.Channel{Brokers: brokersB, TopicTemplate: "bench." + suffix + ".new.{aggregate_type}"}}
	if err := m.ctl.Create(ctx, m.plan, "ferrybench"); err != nil {
		return nil, err
	}
	return m, nil
}

// recordSlot starts a relay on slot and stops it once it recorded the
// slot with the plan's steps in effect: a relay follows a plan from a
// slot only if it decoded (or recorded) every step since the slot's
// start.
func (m *migrationSetup) recordSlot(ctx context.Context, e *env, bin, slot string) error {
	p, err := startRelay(e, bin, m.url, slot, m.oldTemplate)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var recorded bool
		if err := m.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM ferry_relay_slot WHERE slot_name = $1 AND route_steps IS NOT NULL)`,
			slot).Scan(&recorded); err != nil {
			_ = p.stop()
			return err
		}
		if recorded {
			return p.stop()
		}
		if time.Now().After(deadline) {
			_ = p.stop()
			return fmt.Errorf("the relay did not record slot %s with the plan's steps within 30s; its log ends:\n%s", slot, logTail(p.logFile, 3))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dropSlot drops a slot made by slots before the setup closes, so that it
// holds no WAL back.
func (m *migrationSetup) dropSlot(slot string) {
	_, _ = m.pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot)
}

// topicName is the topic of template for aggregateType.
func topicName(template, aggregateType string) string {
	return strings.ReplaceAll(template, "{aggregate_type}", aggregateType)
}

// topicsBoth creates the old and the new channel's topic of each
// aggregate type with partitions partitions.
func (m *migrationSetup) topicsBoth(ctx context.Context, partitions int32, aggregateTypes ...string) error {
	for _, a := range aggregateTypes {
		if err := m.topicsOn(ctx, m.adm, partitions, topicName(m.oldTemplate, a)); err != nil {
			return err
		}
		if err := m.topicsOn(ctx, m.admB, partitions, topicName(m.plan.New.TopicTemplate, a)); err != nil {
			return err
		}
	}
	return nil
}

// moveTo asks for phase (OLD_ONLY or DUAL_WRITE), which must be accepted.
func (m *migrationSetup) moveTo(ctx context.Context, phase migration.Phase) error {
	if phase == m.phase {
		return nil
	}
	d, err := m.ctl.Request(ctx, m.plan.Name, phase, 0, "ferrybench")
	if err != nil {
		return err
	}
	if !d.Accepted {
		return fmt.Errorf("%s refused: %s", phase, d.Reason)
	}
	m.phase = phase
	return nil
}

// lsn is the database's current WAL position: the end of what was
// committed.
func lsn(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var target string
	err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target)
	return target, err
}

// relayDualWriteRounds drains, o.runs times each and in turn, a backlog
// of o.relayEvents (100 per transaction) with the plan in OLD_ONLY (the
// relay writes its own channel) and in DUAL_WRITE (both, every copy
// stamped and acknowledged by both clusters before the position is
// confirmed). One relay binary, one database, a slot for each drain; each
// drain is a real process timed from its start.
func relayDualWriteRounds(ctx context.Context, e *env, bin string, brokersB []string, res *migrationResult) error {
	o := res.o
	m, err := newMigrationSetup(ctx, e, brokersB, "bench_dualwrite")
	if err != nil {
		return err
	}
	defer m.close()
	if err := m.topicsBoth(ctx, 4, "load"); err != nil {
		return err
	}
	suffix := ferrytest.Suffix()
	drains := 0
	drain := func(phase migration.Phase) (rate, cost, busy float64, err error) {
		// A slot of its own, made in OLD_ONLY before the step and the
		// backlog (a relay follows a plan from a slot that saw every step
		// since it was recorded): a slot used again decodes from its
		// restart point, which lags the position it confirmed, so each
		// drain would read more WAL than the last.
		if err := m.moveTo(ctx, migration.OldOnly); err != nil {
			return 0, 0, 0, err
		}
		drains++
		slot := fmt.Sprintf("bench_%s_dual_%d", suffix, drains)
		if err := m.slots(ctx, slot); err != nil {
			return 0, 0, 0, err
		}
		defer m.dropSlot(slot)
		if err := m.recordSlot(ctx, e, bin, slot); err != nil {
			return 0, 0, 0, err
		}
		if err := m.moveTo(ctx, phase); err != nil {
			return 0, 0, 0, err
		}
		if err := writeShapedBacklog(ctx, m.pool, o.relayEvents, 100, o.payload); err != nil {
			return 0, 0, 0, err
		}
		target, err := lsn(ctx, m.pool)
		if err != nil {
			return 0, 0, 0, err
		}
		mark := markCPU()
		d, w, err := drainOnce(ctx, e, bin, m.url, m.pool, slot, m.oldTemplate, target, o.relayArgs...)
		busy, _ = mark.since()
		if err != nil {
			return 0, 0, 0, fmt.Errorf("%s drain: %w", phase, err)
		}
		log("migration: %s drain held by the relay's window %.0f%% of the time", phase, w.held()*100)
		return float64(o.relayEvents) / d.elapsed.Seconds(), w.busy * d.elapsed.Seconds() / float64(o.relayEvents) * 1e6, busy, nil
	}
	for i := range o.runs {
		s, sc, sb, err := drain(migration.OldOnly)
		if err != nil {
			return err
		}
		d, dc, db, err := drain(migration.DualWrite)
		if err != nil {
			return err
		}
		res.singleBusy, res.dualBusy = append(res.singleBusy, sb*100), append(res.dualBusy, db*100)
		res.single, res.dual, res.ratio = append(res.single, s), append(res.dual, d), append(res.ratio, d/s)
		res.singleCost, res.dualCost = append(res.singleCost, sc), append(res.dualCost, dc)
		log("migration, round %d: relay drain one channel %.0f events/s, two %.0f (%.2f)", i+1, s, d, d/s)
	}
	return nil
}

// workerDualWriteRounds fills, through the relay, a topic of each worker
// shape on one channel (the plan in OLD_ONLY: plain records) and the same
// messages on two (DUAL_WRITE: stamped authoritative copies on the old
// channel, shadows on cluster B), then samples a worker on each in turn,
// each from the same reset tables as a consumer group of its own. A
// DUAL_WRITE sample is done when the worker applied every message and
// recorded every shadow.
func workerDualWriteRounds(ctx context.Context, e *env, bin string, brokersB []string, res *migrationResult) error {
	o := res.o
	m, err := newMigrationSetup(ctx, e, brokersB, "bench_dualworker")
	if err != nil {
		return err
	}
	defer m.close()
	if _, err := m.pool.Exec(ctx, `CREATE TABLE bench_accounts (id int PRIMARY KEY, balance bigint NOT NULL, version bigint NOT NULL)`); err != nil {
		return err
	}
	shapes := []struct {
		name     string
		batch, n int
	}{{"one", 1, o.onePerTx}, {"batch", o.batch, o.batched}}
	shapes = slices.DeleteFunc(shapes, func(s struct {
		name     string
		batch, n int
	}) bool {
		return s.n <= 0
	})
	if len(shapes) == 0 {
		return nil
	}
	// The plain records go to aggregate types of their own ("one-plain",
	// "batch-plain"), written before the plan leaves OLD_ONLY.
	for _, s := range shapes {
		if err := m.topicsBoth(ctx, workerPartitions, s.name, s.name+"-plain"); err != nil {
			return err
		}
	}
	slot := "bench_" + ferrytest.Suffix() + "_fill"
	if err := m.slots(ctx, slot); err != nil {
		return err
	}
	fill := func(phase migration.Phase, suffix string) error {
		if err := m.moveTo(ctx, phase); err != nil {
			return err
		}
		for _, s := range shapes {
			if err := writeBacklog(ctx, m.pool, outboxEvents{n: s.n, perTx: 1000, payload: o.payload, aggregateType: s.name + suffix,
				keys: workerAccounts}); err != nil {
				return err
			}
		}
		target, err := lsn(ctx, m.pool)
		if err != nil {
			return err
		}
		_, _, err = drainOnce(ctx, e, bin, m.url, m.pool, slot, m.oldTemplate, target)
		return err
	}
	log("migration: filling the worker's topics through the relay, in OLD_ONLY, then in DUAL_WRITE")
	if err := fill(migration.OldOnly, "-plain"); err != nil {
		return err
	}
	if err := fill(migration.DualWrite, ""); err != nil {
		return err
	}
	for _, s := range shapes {
		r := migrationWorkerResult{batch: s.batch, n: s.n}
		for i := range o.runs {
			single, _, sc, err := migrationWorkerOnce(ctx, e, m, topicName(m.oldTemplate, s.name+"-plain"), fmt.Sprintf("bench_plain_%s_%d", s.name, i), s.n, s.batch, false)
			if err != nil {
				return err
			}
			dual, behind, dc, err := migrationWorkerOnce(ctx, e, m, topicName(m.oldTemplate, s.name), fmt.Sprintf("bench_dual_%s_%d", s.name, i), s.n, s.batch, true)
			if err != nil {
				return err
			}
			r.oldOnly, r.dual, r.ratio = append(r.oldOnly, single), append(r.dual, dual), append(r.ratio, dual/single)
			r.shadowsBehindApply = append(r.shadowsBehindApply, behind.Seconds())
			r.oldWorker, r.oldPostgres, r.oldWAL = append(r.oldWorker, sc.worker), append(r.oldPostgres, sc.postgres), append(r.oldWAL, sc.wal)
			r.dualWorker, r.dualPostgres, r.dualWAL = append(r.dualWorker, dc.worker), append(r.dualPostgres, dc.postgres), append(r.dualWAL, dc.wal)
			log("migration, worker batch %d, sample %d: OLD_ONLY %.0f msg/s, DUAL_WRITE %.0f (%.2f); per message worker %.0f/%.0f µs CPU, PostgreSQL %.0f/%.0f µs, WAL %.0f/%.0f B",
				s.batch, i+1, single, dual, dual/single, sc.worker, dc.worker, sc.postgres, dc.postgres, sc.wal, dc.wal)
		}
		res.workers = append(res.workers, r)
	}
	return nil
}

// migrationWorkerOnce runs a worker of the benchmark's shape over topic's
// n messages from freshly reset tables and returns its rate and what each
// message cost over the same time. With shadows, the run ends when the
// worker also recorded the n shadow copies of the new channel; behind is
// how long after the last apply that was.
func migrationWorkerOnce(ctx context.Context, e *env, m *migrationSetup, topic, consumer string, n, batch int, shadows bool) (rate float64, behind time.Duration, cost workerCost, err error) {
	if err := resetWorkerTables(ctx, m.pool, "ferry_inbox_copy", "ferry_inbox_fence", "ferry_inbox_channel", "ferry_inbox_quarantine"); err != nil {
		return 0, 0, cost, err
	}
	s := shapeOf(batch)
	cfg := &inbox.Config{DB: m.pool, KafkaOpts: []kgo.Opt{kgo.SeedBrokers(e.brokers...)}, Concurrency: s.concurrency,
		KeyConcurrency: s.keyConcurrency, BatchSize: s.batch}
	var settle func(context.Context) error
	if shadows {
		settle = func(ctx context.Context) error {
			applied := time.Now()
			defer func() { behind = time.Since(applied) }()
			for {
				var recorded int
				if err := m.pool.QueryRow(ctx, `SELECT count(*) FROM ferry_inbox_copy WHERE consumer = $1 AND role = 'shadow'`, consumer).Scan(&recorded); err != nil {
					return err
				}
				if recorded >= n {
					return nil
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(5 * time.Millisecond):
				}
			}
		}
	}
	rate, err = runWorkerUntil(ctx, cfg, topic, consumer, n, settle, &cost)
	return rate, behind, cost, err
}

func (r *migrationResult) markdown() string {
	var b strings.Builder
	b.WriteString("\n## What a live migration costs\n\n")
	b.WriteString("A plan from the stack's Kafka to its second cluster, B (`migration.Controller`, the relay a real `relay run` process following it). " +
		"The relay drains the same-sized backlog in turn with the plan in OLD_ONLY (it writes its own channel) and in DUAL_WRITE (it writes both, " +
		"every copy stamped, and confirms a position only once both clusters acknowledged everything before it), from one slot, each drain timed from its process start. " +
		"The worker (in-process `inbox.Worker`, the worker benchmark's shape and handler) reads, in turn and from the same reset tables, records the relay wrote in OLD_ONLY " +
		"and the same messages written in DUAL_WRITE: it applies the old channel's authoritative copies, follows the plan onto cluster B by itself and records its shadow copies; " +
		"a DUAL_WRITE sample ends when every message is applied and every shadow recorded. Ratios are paired within a round.\n\n")
	fmt.Fprintf(&b, "| figure (median (min–max) of %d rounds) | one channel (OLD_ONLY) | two channels (DUAL_WRITE) | DUAL_WRITE / OLD_ONLY | target |\n|---|---|---|---|---|\n", len(r.ratio))
	fmt.Fprintf(&b, "| relay drain, %d-event backlog, 100 events per transaction, events/s | %s (%s µs CPU per event; machine %s%% busy) | %s (%s µs; %s%%) | **%s** | >= 0.75 |\n",
		r.o.relayEvents, r.single.Format("%.0f"), r.singleCost.Format("%.1f"), r.singleBusy.Format("%.0f"),
		r.dual.Format("%.0f"), r.dualCost.Format("%.1f"), r.dualBusy.Format("%.0f"), r.ratio.Format("%.2f"))
	for _, w := range r.workers {
		shape := "one message per transaction"
		if w.batch > 1 {
			shape = fmt.Sprintf("batches of %d messages", w.batch)
		}
		fmt.Fprintf(&b, "| worker, %s, %d messages, msg/s | %s | %s (shadows recorded %s s after the last apply) | **%s** | >= 0.85 |\n",
			shape, w.n, w.oldOnly.Format("%.0f"), w.dual.Format("%.0f"), w.shadowsBehindApply.Format("%.2f"), w.ratio.Format("%.2f"))
	}
	if len(r.workers) == 0 {
		return b.String()
	}
	b.WriteString("\nWhat each message cost the worker's run, over the same time as its rate: µs of CPU of the worker's process (the in-process `inbox.Worker` with its Kafka clients), " +
		"µs of CPU of the machine's PostgreSQL processes (backends, WAL writer, checkpointer, autovacuum) and bytes of WAL written (`pg_current_wal_lsn()`):\n\n" +
		"| worker, per message | worker CPU, µs | PostgreSQL CPU, µs | WAL, bytes |\n|---|---|---|---|\n")
	for _, w := range r.workers {
		shape := "one message per transaction"
		if w.batch > 1 {
			shape = fmt.Sprintf("batches of %d messages", w.batch)
		}
		fmt.Fprintf(&b, "| %s, OLD_ONLY | %s | %s | %s |\n", shape, w.oldWorker.Format("%.0f"), w.oldPostgres.Format("%.0f"), w.oldWAL.Format("%.0f"))
		fmt.Fprintf(&b, "| %s, DUAL_WRITE | %s | %s | %s |\n", shape, w.dualWorker.Format("%.0f"), w.dualPostgres.Format("%.0f"), w.dualWAL.Format("%.0f"))
	}
	return b.String()
}
