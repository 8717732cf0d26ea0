package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/kafkaauth"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
)

// The relay's part of a live broker migration (package migration).
//
// A step (a row of ferry_migration_step) reaches the relay in the WAL, in
// the same stream as the outbox rows, so it applies at its exact point of
// the commit order: every event committed before the step's transaction is
// routed by the previous step, every event after it by the new one (events
// in the step's own transaction, by the previous one). At a step the relay
// reads no further until everything before the step is acknowledged; then
// it records the step with the slot, in effect from the end of its
// transaction (ferry_relay_slot.route_steps), and only then confirms the
// step's transaction. A restarted relay takes as in effect the newest
// recorded step at or before the position the stream resumes from; the
// later ones come again in the stream, each at its point
// (step_history.go).
//
// With a plan in DUAL_WRITE or CUTOVER the relay writes every event to both
// channels, each copy stamped (route.HeaderRoute), and a transaction is
// confirmed only when every copy of every record was acknowledged: the LSN
// tracker counts copies. At the first event of each topic under a step, in
// each session, it writes a fence (route.HeaderFence) to every
// partition of that topic on each channel, before the event: a consumer
// that passed those fences has seen every record written there under
// earlier steps (see route.History.Since). In OLD_RETIRED it writes the
// new channel only, without fences: the drain that OLD_RETIRED requires
// means the consumers applied everything the old channel held.

// channelOut is a channel the relay writes: its own (the old channel of a
// migration) or a migration's new one.
type channelOut struct {
	side  migration.Side
	sink  Sink
	namer *topicNamer
	gate  *topicGate
	// layout counts the fences of a topic; nil for a Config.Sink, which
	// no migration uses.
	layout channelLayout

	// A new channel given up by an abandon (releaseNew): its pending
	// copies and fences, counted by the tracker until answered, and
	// whether it was released. The own channel uses neither.
	mu       sync.Mutex
	pending  map[any]pendingCopy
	released atomic.Bool
}

// pendingCopy is what a record sent to a new channel holds in the tracker.
type pendingCopy struct {
	tx   *txn
	size int
	copy bool // a further copy of an event (lsnTracker.produceCopy)
}

// track counts a record sent to the channel as pending; false when the
// channel was released (the record is not to be sent).
func (c *channelOut) track(key any, tx *txn, size int, copy bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released.Load() {
		return false
	}
	if c.pending == nil {
		c.pending = map[any]pendingCopy{}
	}
	c.pending[key] = pendingCopy{tx, size, copy}
	return true
}

// settle takes an answered record out of the pending ones; false when the
// channel was released, which acknowledged it already.
func (c *channelOut) settle(key any) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released.Load() {
		return false
	}
	delete(c.pending, key)
	return true
}

// release marks the channel given up and returns its pending records.
func (c *channelOut) release() []pendingCopy {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released.Store(true)
	out := make([]pendingCopy, 0, len(c.pending))
	for _, p := range c.pending {
		out = append(out, p)
	}
	c.pending = nil
	return out
}

// router routes the events of a session while a plan is in effect (any
// phase but OLD_ONLY).
type router struct {
	plan    migration.Plan
	history route.History // the plan's applied steps; the last is in effect
	since   [migration.Slices]int
	outs    map[migration.Side]*channelOut
	fenced  map[fenceKey]int       // the epoch whose fences this session wrote, per topic
	unknown map[fenceKey]time.Time // topics found missing, and when
	// partitions are those of topics looked up off the loop for the
	// fences before an event (lookUpFences); fence takes them.
	partitions map[fenceKey]int

	// epoch mirrors the step in effect for watchAbandon; abandonAt is the
	// epoch after which watchAbandon found OLD_ONLY committed (0: not yet).
	epoch, abandonAt atomic.Int64

	// copies are the counters of ferry_relay_migration_copies_total by
	// side and role, looked up once: every copy counts in one.
	copies [4]prometheus.Counter

	// stamps are route headers' values rendered once and shared by every
	// copy with the same stamp (a record's headers are read, never
	// written); at most maxStamps, then rendered anew. lastStamps holds
	// the last stamp of each slice, side and role before it: comparing a
	// stamp costs less than hashing one.
	stamps     map[route.Stamp][]byte
	lastStamps [migration.Slices * 4]renderedStamp

	// last is what the last event's types named (memo).
	last routeMemo
}

type renderedStamp struct {
	stamp route.Stamp
	value []byte
}

// routeMemo keeps what the last event's aggregate and event types named:
// its topic on each channel and, once found, the step whose fences this
// session wrote on each. The next event of the same types looks up
// neither (about ten map lookups for its two copies); one of other types
// fills it again, at about the cost of those lookups.
type routeMemo struct {
	aggregateType, eventType []byte // the memo's own copies, once set
	set                      bool
	topics                   [2]namedTopic // by sideIndex
	fencedAt                 [2]int        // the epoch of rt.fenced of each topic, once found; -1: not found
}

func sideIndex(side migration.Side) int {
	if side == migration.NewSide {
		return 1
	}
	return 0
}

// memo returns the topics of r's types on both channels.
func (rt *router) memo(r *row) *routeMemo {
	m := &rt.last
	if m.set && bytes.Equal(m.aggregateType, r.AggregateType) && bytes.Equal(m.eventType, r.EventType) {
		return m
	}
	m.aggregateType = append(m.aggregateType[:0], r.AggregateType...)
	m.eventType = append(m.eventType[:0], r.EventType...)
	for side, out := range rt.outs {
		m.topics[sideIndex(side)] = out.namer.topic(r)
	}
	m.fencedAt, m.set = [2]int{-1, -1}, true
	return m
}

// fencedAll reports whether this session wrote the fences of the step in
// effect on the topic of each of copies (named by m): none is due. A
// topic's fences, once written, stay written until the next step.
func (rt *router) fencedAll(m *routeMemo, copies []route.Copy) bool {
	epoch := rt.step().Epoch
	for _, c := range copies {
		i := sideIndex(c.Side)
		if m.fencedAt[i] == epoch {
			continue
		}
		if e, ok := rt.fenced[fenceKey{c.Side, m.topics[i].name}]; !ok || e != epoch {
			return false
		}
		m.fencedAt[i] = epoch
	}
	return true
}

// maxStamps bounds router.stamps: a stamp per slice, side, role and topic
// of a step.
const maxStamps = 4096

// stampValue returns st rendered, from stamps when it was before.
func (rt *router) stampValue(st route.Stamp) []byte {
	var last *renderedStamp
	if st.Slice >= 0 && st.Slice < migration.Slices {
		last = &rt.lastStamps[st.Slice*4+copyIndex(route.Copy{Side: st.Side, Role: st.Role})]
		if last.value != nil && last.stamp == st {
			return last.value
		}
	}
	v, ok := rt.stamps[st]
	if !ok {
		if len(rt.stamps) >= maxStamps {
			clear(rt.stamps)
		}
		v = st.Bytes()
		rt.stamps[st] = v
	}
	if last != nil {
		last.stamp, last.value = st, v
	}
	return v
}

// copyIndex numbers c's side and role from 0 to 3.
func copyIndex(c route.Copy) int {
	i := 2 * sideIndex(c.Side)
	if c.Role == route.Shadow {
		i++
	}
	return i
}

// copiesOf is the counter of c's side and role, from vec.
func (rt *router) copiesOf(vec *prometheus.CounterVec, c route.Copy) prometheus.Counter {
	i := copyIndex(c)
	if rt.copies[i] == nil {
		rt.copies[i] = vec.WithLabelValues(string(c.Side), string(c.Role))
	}
	return rt.copies[i]
}

type fenceKey struct {
	side  migration.Side
	topic string
}

func (rt *router) step() route.Step { return rt.history[len(rt.history)-1] }

// setHistory makes the newest of h the step in effect.
func (rt *router) setHistory(h route.History) {
	rt.history = h
	rt.epoch.Store(int64(h[len(h)-1].Epoch))
	for slice := range rt.since {
		rt.since[slice] = h.Since(slice)
	}
}

// pendingStep is a step decoded in the open transaction, or committed and
// waiting for everything before it to be acknowledged.
type pendingStep struct {
	steps []stepRow
	tx    *txn
	end   pglogrepl.LSN // end of the step's transaction; 0 until it commits
}

// stepRow is a decoded insert into ferry_migration_step.
type stepRow struct {
	route.Step
	Seq int64
}

// errRouteUnknown: the slot was recorded before the relay followed
// migrations while a plan moves.
var errRouteUnknown = fmt.Errorf("%w: migration step in effect unknown", ErrFatal)

// loadRoute sets the step in effect at start, the position the stream
// resumes from (step_history.go): s.routeSeq and s.route.
func (s *session) loadRoute(ctx context.Context, pool *pgxpool.Pool, start pglogrepl.LSN) error {
	seq, err := stepInEffect(ctx, pool, s.cfg.Slot, start)
	if err != nil {
		return err
	}
	rows, err := s.r.queries.MigrationStepsThrough(ctx, pool, seq)
	if err != nil {
		return fmt.Errorf("read the migration steps: %w", err)
	}
	s.routeSeq = seq
	byPlan := map[string]route.History{}
	var order []string
	for _, r := range rows {
		if _, ok := byPlan[r.Migration]; !ok {
			order = append(order, r.Migration)
		}
		byPlan[r.Migration] = append(byPlan[r.Migration], route.Step{
			Plan: r.Migration, Epoch: int(r.Epoch), Phase: migration.Phase(r.Phase), Slices: int(r.Slices)})
	}
	s.route = nil
	for _, name := range order {
		h := byPlan[name]
		if h[len(h)-1].Phase == migration.OldOnly {
			continue
		}
		if s.route != nil {
			return fmt.Errorf("%w: plans %q and %q are both in effect; a relay follows one migration at a time", ErrFatal, s.route.plan.Name, name)
		}
		if err := s.activate(ctx, pool, name, h); err != nil {
			return err
		}
	}
	return nil
}

// adoptRoute records the route of a slot recorded before the relay
// followed migrations. Steps committed before the publication carried
// ferry_migration_step never reach the stream, so the relay cannot know
// where they applied: that is harmless only while every plan is in
// OLD_ONLY (the relay writes as without one).
func adoptRoute(ctx context.Context, pool *pgxpool.Pool, slot string) (int64, error) {
	var seq int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := dbsqlc.New()
		if err := q.MigrationSerialize(ctx, tx); err != nil {
			return err
		}
		busy, err := q.MigrationActiveOther(ctx, tx, "")
		if err != nil {
			return err
		}
		if len(busy) > 0 {
			return fmt.Errorf("%w: slot %q was recorded before the relay followed migrations, and plan %q is in %s: the relay cannot tell "+
				"which events its steps apply to. Abandon the plan (relay migration request %s OLD_ONLY), or give the relay a new slot "+
				"(relay recover)", errRouteUnknown, slot, busy[0].Migration, busy[0].Phase, busy[0].Migration)
		}
		if seq, err = q.MigrationStepNewest(ctx, tx); err != nil {
			return err
		}
		return recordStep(ctx, tx, slot, seq, 0)
	})
	if err != nil && !errors.Is(err, ErrFatal) {
		return 0, fmt.Errorf("record the migration step of slot %q: %w", slot, err)
	}
	return seq, err
}

// activate makes plan name, at history h, the one the session routes by.
func (s *session) activate(ctx context.Context, pool *pgxpool.Pool, name string, h route.History) error {
	st, err := (&migration.Controller{DB: pool}).State(ctx, name)
	if err != nil {
		return err
	}
	p := st.Plan
	if err := s.r.ownChannel(&p, h[len(h)-1].Phase); err != nil {
		return err
	}
	newOut, err := s.r.newChannel(s, p)
	if err != nil {
		return err
	}
	rt := &router{plan: p, outs: map[migration.Side]*channelOut{migration.OldSide: s.own, migration.NewSide: newOut},
		fenced: map[fenceKey]int{}, unknown: map[fenceKey]time.Time{}, partitions: map[fenceKey]int{},
		stamps: map[route.Stamp][]byte{}}
	rt.setHistory(h)
	s.route = rt
	s.r.newGate.Store(newOut.gate)
	go s.watchAbandon(rt)
	s.log.Info("following live migration", slog.String("plan", name), slog.String("phase", string(rt.step().Phase)),
		slog.Int("slices", rt.step().Slices), slog.Int("epoch", rt.step().Epoch))
	return nil
}

// ownChannel refuses plan p, whose step in effect is in phase, unless its
// old channel is the relay's own: the same kind, topic template and (on
// RabbitMQ) shards. Once the plan is retired the relay writes the new
// channel only, and its own settings no longer matter.
func (r *Relay) ownChannel(p *migration.Plan, phase migration.Phase) error {
	if phase == migration.OldRetired {
		return nil
	}
	own, flags := migration.Kafka, "--kafka-*"
	if r.cfg.RabbitMQ != nil {
		own, flags = migration.RabbitMQ, "--rabbitmq-*"
	}
	switch {
	case p.Old.KindOf() != own:
		return fmt.Errorf("%w: migration plan %q leaves a %s channel, but the relay writes %s: the plan's old channel must be "+
			"the relay's own (its %s settings and --topic-template)", ErrFatal, p.Name, p.Old.KindOf(), own, flags)
	case p.Old.TopicTemplate != r.cfg.TopicTemplate:
		return fmt.Errorf("%w: migration plan %q leaves topic template %q, but the relay writes %q: the plan's old channel must be "+
			"the relay's own (its %s settings and --topic-template)", ErrFatal, p.Name, p.Old.TopicTemplate, r.cfg.TopicTemplate, flags)
	case own == migration.RabbitMQ && p.Old.Shards != r.cfg.RabbitMQ.Shards:
		return fmt.Errorf("%w: migration plan %q leaves a RabbitMQ channel of %d shards, but the relay writes %d (--rabbitmq-shards): "+
			"the fences of a shard must go where its events go", ErrFatal, p.Name, p.Old.Shards, r.cfg.RabbitMQ.Shards)
	}
	return nil
}

// closingSink is the sink of a migration's new channel, which the relay
// keeps for the plan across sessions and closes at the end.
type closingSink interface {
	Sink
	Close()
}

// newChannelSinks are the sinks of the migrations' new channels.
func (r *Relay) newChannelSinks() map[string]closingSink {
	r.outsMu.Lock()
	defer r.outsMu.Unlock()
	return maps.Clone(r.outs)
}

// newChannel returns the session's view of plan p's new channel, on a
// client the relay keeps for the plan across sessions.
func (r *Relay) newChannel(s *session, p migration.Plan) (*channelOut, error) {
	if r.cfg.Sink != nil {
		return nil, fmt.Errorf("%w: migration plan %q is in effect, and a live migration needs the relay's own broker clients "+
			"(Config.Sink is set)", ErrFatal, p.Name)
	}
	r.outsMu.Lock()
	defer r.outsMu.Unlock()
	sink := r.outs[p.Name]
	if sink == nil {
		var err error
		if sink, err = r.newChannelSink(p, s.log.With(slog.String("channel", "new"))); err != nil {
			return nil, err
		}
		r.outs[p.Name] = sink
	}
	out := &channelOut{side: migration.NewSide, sink: sink, namer: newTopicNamer(p.New.TopicTemplate), layout: layoutOf(sink)}
	out.gate = newTopicGate(s, out.sink)
	return out, nil
}

// newChannelSink makes the sink of plan p's new channel. On RabbitMQ, the
// plan's groups are the consumers whose shard queues must exist before an
// exchange is written: a copy never reaches another group's queue while
// one of theirs is missing.
func (r *Relay) newChannelSink(p migration.Plan, log *slog.Logger) (closingSink, error) {
	if p.New.KindOf() == migration.RabbitMQ {
		conn, err := rabbitmq.PlanChannel{Side: "new", URL: p.New.URL, PasswordEnv: p.New.PasswordEnv,
			TLS: kafkaauth.TLSFiles{CA: p.New.TLSCAFile, Cert: p.New.TLSCertFile, Key: p.New.TLSKeyFile}}.Conn(nil)
		if err != nil {
			return nil, fmt.Errorf("%w: migration plan %q: %w", ErrFatal, p.Name, err)
		}
		rc := RabbitMQConfig{URL: conn.URL, Password: conn.Password, TLSCAFile: conn.TLS.CA, TLSCertFile: conn.TLS.Cert,
			TLSKeyFile: conn.TLS.Key, Shards: p.New.Shards, Consumers: p.Groups}
		if own := r.cfg.RabbitMQ; own != nil {
			rc.Channels, rc.MaxMessageBytes = own.Channels, own.MaxMessageBytes
		}
		rc = rc.withDefaults()
		if err := rc.validate(); err != nil {
			return nil, fmt.Errorf("%w: the new channel of migration plan %q: %w", ErrFatal, p.Name, err)
		}
		return newRabbitMQSink(&rc, &r.cfg, r.metrics, log), nil
	}
	opts, err := p.New.KafkaOpts("new", nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFatal, err)
	}
	ks, err := newKafkaSink(append(uncompressedUnlessChosen(opts), r.producerOptsOwn()...), r.cfg.TopicConfigRefresh, log)
	if err != nil {
		return nil, fmt.Errorf("relay: kafka client of the new channel of plan %q: %w", p.Name, err)
	}
	return ks, nil
}

// abandonPoll is how often a session in a migration looks for an abandon
// committed ahead of the stream (watchAbandon).
const abandonPoll = time.Second

// watchAbandon polls the plan's steps until the one after the step in
// effect is OLD_ONLY, and records it in rt.abandonAt. The stream brings
// that step in its place in the commit order; but while the new channel
// is down the relay reads no further than what that channel holds back,
// and the abandon, which is the way out, would never arrive.
func (s *session) watchAbandon(rt *router) {
	t := time.NewTicker(abandonPoll)
	defer t.Stop()
	for {
		select {
		case <-s.sctx.Done():
			return
		case <-t.C:
		}
		epoch := rt.epoch.Load()
		phase, err := s.r.queries.MigrationNextPhase(s.sctx, s.pool, dbsqlc.MigrationNextPhaseParams{Migration: rt.plan.Name, Epoch: int32(epoch)})
		if err == nil && migration.Phase(phase) == migration.OldOnly {
			rt.abandonAt.Store(epoch)
			return
		}
	}
}

// releaseNew gives up the new channel once the plan's next step is an
// abandon committed ahead of the stream, while DUAL_WRITE is in effect:
// every copy written there since DUAL_WRITE applied is a shadow (the old
// copy is authoritative), and nothing written there counts once the plan
// is abandoned. The copies and fences pending there count as acknowledged,
// and no more are sent until the abandon applies. It reports whether the
// new channel is released.
func (s *session) releaseNew() bool {
	rt := s.route
	if rt == nil {
		return false
	}
	out := rt.outs[migration.NewSide]
	if out.released.Load() {
		return true
	}
	st := rt.step()
	if st.Phase != migration.DualWrite || rt.abandonAt.Load() != int64(st.Epoch) {
		return false
	}
	pending := out.release()
	for _, p := range pending {
		s.tracker.ackOne(p.tx, p.size, p.copy)
	}
	s.r.newGate.Store(nil)
	s.log.Warn("live migration abandoned while its new channel holds the relay back: the shadow copies pending there are given up, "+
		"and the old channel alone is written until the abandon applies", slog.String("plan", rt.plan.Name),
		slog.Int("epoch", st.Epoch), slog.Int("pending", len(pending)))
	return true
}

// noteStep takes a decoded step: it applies when its transaction commits
// and everything before it is acknowledged. A step already in effect (one
// the slot's start included) is skipped.
func (s *session) noteStep(st stepRow) {
	if st.Seq <= s.routeSeq {
		return
	}
	if s.step == nil {
		s.step = &pendingStep{tx: s.open}
		s.tracker.holdStep(s.open) // unconfirmed until it applies
	}
	s.step.steps = append(s.step.steps, st)
}

// stepReady reports whether a committed step waits for nothing but itself.
func (s *session) stepReady() bool {
	return s.step != nil && s.step.end != 0 && s.tracker.onlyHolds(s.step.tx)
}

// applyStep records the committed steps with the slot, routes by them,
// and releases their transaction for confirmation. It calls Kafka and the
// database: the loop runs it as a pending call.
func (s *session) applyStep(ctx context.Context) error {
	ps := s.step
	last := ps.steps[len(ps.steps)-1]
	if err := recordStep(ctx, s.pool, s.cfg.Slot, last.Seq, ps.end); err != nil {
		return fmt.Errorf("apply migration step %s/%d on slot %q: %w", last.Plan, last.Epoch, s.cfg.Slot, err)
	}
	for _, st := range ps.steps {
		if err := s.follow(ctx, st.Step); err != nil {
			return err
		}
		s.routeSeq = st.Seq
	}
	// The new step's fences, counted in its transaction: it is confirmed
	// once they are acknowledged.
	if err := s.fenceAll(ctx, ps.tx); err != nil {
		return err
	}
	s.step = nil
	s.tracker.releaseStep(ps.tx)
	return nil
}

// follow makes st the step in effect from here on.
func (s *session) follow(ctx context.Context, st route.Step) error {
	rt := s.route
	switch {
	case rt != nil && rt.plan.Name != st.Plan:
		if st.Phase == migration.OldOnly {
			return nil // another plan created, or abandoned: nothing changes here
		}
		return fmt.Errorf("%w: migration plan %q moved to %s while plan %q is in effect; a relay follows one migration at a time",
			ErrFatal, st.Plan, st.Phase, rt.plan.Name)
	case rt != nil && st.Phase == migration.OldOnly:
		s.log.Info("live migration abandoned: writing the old channel only", slog.String("plan", st.Plan), slog.Int("epoch", st.Epoch))
		s.route = nil
		s.r.newGate.Store(nil)
		return nil
	case rt != nil:
		rt.setHistory(append(slices.Clone(rt.history), st))
		s.log.Info("migration step in effect", slog.String("plan", st.Plan), slog.String("phase", string(st.Phase)),
			slog.Int("slices", st.Slices), slog.Int("epoch", st.Epoch))
		s.r.metrics.migrationEpoch.Set(float64(st.Epoch))
		return nil
	case st.Phase == migration.OldOnly:
		return nil
	}
	h, err := s.stepsUpTo(ctx, st)
	if err != nil {
		return err
	}
	if err := s.activate(ctx, s.pool, st.Plan, h); err != nil {
		return err
	}
	s.r.metrics.migrationEpoch.Set(float64(st.Epoch))
	return nil
}

// stepVisibleWait bounds how long the relay waits for a decoded step's
// row to be visible to its own queries.
const stepVisibleWait = 5 * time.Second

// stepsUpTo reads the plan's steps up to st, which must be the last of
// them. PostgreSQL can send a transaction's changes before that commit is
// visible to other sessions' snapshots (the walsender decodes the flushed
// commit record; the committing backend leaves the list of running
// transactions a moment later): a step decoded but not read yet is read
// again, for up to stepVisibleWait. Seen on PostgreSQL 18 under load
// (TestStatusUpdatesGoOnWhileTheNewChannelIsSilent in make test): the
// session was reset over "step 1 is not in ferry_migration_step".
func (s *session) stepsUpTo(ctx context.Context, st route.Step) (route.History, error) {
	deadline := time.Now().Add(stepVisibleWait)
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		rows, err := s.r.queries.MigrationSteps(ctx, s.pool, st.Plan)
		if err != nil {
			return nil, fmt.Errorf("read the steps of migration plan %q: %w", st.Plan, err)
		}
		var h route.History
		for _, r := range rows {
			if int(r.Epoch) <= st.Epoch {
				h = append(h, route.Step{Plan: r.Migration, Epoch: int(r.Epoch), Phase: migration.Phase(r.Phase), Slices: int(r.Slices)})
			}
		}
		switch {
		case len(h) > 0 && h[len(h)-1] == st:
			return h, nil
		case len(h) > 0 && h[len(h)-1].Epoch == st.Epoch, time.Now().After(deadline):
			return nil, fmt.Errorf("migration plan %q: step %d is not in ferry_migration_step as decoded", st.Plan, st.Epoch)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// publishRouted hands one event to the channels the step in effect names,
// each copy stamped; the authoritative copy first. When a fence must come
// before a copy and its topic's partitions are not known, they are looked
// up off the loop first, and the event goes out once they are.
func (s *session) publishRouted(p *inflight) {
	rt := s.route
	st := rt.step()
	copies := st.Route(p.row.AggregateID)
	fenced := st.Phase == migration.OldRetired || rt.fencedAll(rt.memo(&p.row), copies)
	if !fenced {
		if keys := s.fenceLookups(&p.row, copies); len(keys) > 0 {
			s.await(func(ctx context.Context) error { return s.lookUpFences(ctx, keys) },
				func() error { s.routeCopies(p, copies, false); return nil })
			return
		}
	}
	s.routeCopies(p, copies, fenced)
}

// routeCopies sends p's copies, each after its topic's fence when one is
// due; fenced says none is (every copy's topic was fenced at the step in
// effect, and a fence, once written, stays written until the next step).
// Every copy is built before the first is sent: a copy may be
// acknowledged, and its inflight recycled, as soon as it is sent.
func (s *session) routeCopies(p *inflight, copies []route.Copy, fenced bool) {
	rt := s.route
	st := rt.step()
	slice := route.Slice(p.row.AggregateID)
	m := rt.memo(&p.row)
	type built struct {
		q     *inflight
		topic namedTopic
		peer  string
	}
	var buf [2]built // a copy per channel
	out := buf[:0]
	for i, c := range copies {
		q := p
		if i > 0 {
			q = s.inflights.get()
			q.row, q.tx, q.commit, q.heard, q.lsn, q.seq = p.row, p.tx, p.commit, p.heard, p.lsn, p.seq
		}
		ch := rt.outs[c.Side]
		topic := m.topics[sideIndex(c.Side)]
		peer := m.topics[sideIndex(other(c.Side))].name
		q.fill(topic.name, s.cfg.CloudEvents)
		s.r.tracing.start(q)
		q.out, q.shadow, q.copy = ch, c.Role == route.Shadow, i > 0
		q.copies = rt.copiesOf(s.r.metrics.copies, c)
		stamp := route.Stamp{Plan: rt.plan.Name, Epoch: st.Epoch, Slice: slice, Side: c.Side, Role: c.Role}
		if c.Role == route.Authoritative && st.Phase != migration.OldRetired && rt.since[slice] > 0 {
			stamp.Since = rt.since[slice]
			stamp.Peer = peer
		}
		q.rec.Headers = append(q.rec.Headers, kgo.RecordHeader{Key: route.HeaderRoute, Value: rt.stampValue(stamp)})
		q.size = recordSize(&q.rec)
		out = append(out, built{q, topic, peer})
	}
	for i, b := range out {
		q := b.q
		if b.topic.problem == "" && !fenced {
			s.fence(q.out, b.topic.name, b.peer, q.tx)
		}
		if i == 0 {
			s.tracker.produce(q.tx, q.size)
		} else {
			s.tracker.produceCopy(q.tx, q.size)
		}
		if i == 0 && s.hold != nil && !s.hold.admit(s.sctx, q) {
			continue // behind an earlier event of its aggregate; its shadow copy goes on
		}
		s.send(q, b.topic.problem)
	}
}

func other(side migration.Side) migration.Side {
	if side == migration.OldSide {
		return migration.NewSide
	}
	return migration.OldSide
}

// fenceRecord is a fence on its way: its own record Context, which the
// partitioner recognizes (it goes to the partition it names).
type fenceRecord struct {
	context.Context
	rec  kgo.Record
	out  *channelOut
	tx   *txn
	size int
}

// fence writes the step's fence to every partition of topic on out (its
// value the other channel, peer the same events' topic there), once per
// step and session, counted in tx like a record of it, with the partitions
// lookUpFences found. A topic that does not exist holds nothing to fence
// (its records are held, then quarantined, by the gate); it is looked up
// again, at most once a second, until it does.
func (s *session) fence(out *channelOut, topic, peer string, tx *txn) {
	rt := s.route
	key := fenceKey{out.side, topic}
	if !rt.unfenced(key, out) {
		return
	}
	n, ok := rt.partitions[key]
	if !ok {
		return
	}
	delete(rt.partitions, key)
	s.writeFences(out, topic, peer, n, tx)
}

// unfenced reports whether the topic of key on out needs the fence of the
// step in effect before its next record: this session has not written it,
// the channel is not given up, and the topic was not found missing within
// the last second.
func (rt *router) unfenced(key fenceKey, out *channelOut) bool {
	if e, ok := rt.fenced[key]; ok && e == rt.step().Epoch {
		return false
	}
	if out.released.Load() {
		return false
	}
	at, ok := rt.unknown[key]
	return !ok || time.Since(at) >= time.Second
}

// fenceLookups returns the topics of r's copies that need a fence and whose
// partitions the session does not know.
func (s *session) fenceLookups(r *row, copies []route.Copy) []fenceKey {
	rt := s.route
	var keys []fenceKey
	for _, c := range copies {
		out := rt.outs[c.Side]
		topic := out.namer.topic(r)
		key := fenceKey{c.Side, topic.name}
		if topic.problem != "" || !rt.unfenced(key, out) {
			continue
		}
		if _, ok := rt.partitions[key]; !ok {
			keys = append(keys, key)
		}
	}
	return keys
}

// lookUpFences reads the partitions of the topics of keys, each on its
// channel, for fence; a topic found missing is remembered as such. It calls
// Kafka: the loop runs it as a pending call.
func (s *session) lookUpFences(ctx context.Context, keys []fenceKey) error {
	rt := s.route
	for _, key := range keys {
		counts, err := s.metadata(ctx, rt.outs[key.side], key.topic)
		if err != nil {
			return err
		}
		n, ok := counts[key.topic]
		if !ok {
			rt.unknown[key] = time.Now()
			continue
		}
		delete(rt.unknown, key)
		rt.partitions[key] = n
	}
	return nil
}

// fenceAll writes the step's fences, when it applies, to every topic of
// both channels that their templates name and that exists: so a
// partition's fence of the step exists even if no event of its topic
// follows (the drain before OLD_RETIRED waits for them). A topic whose
// peer the other template cannot name (it uses a placeholder this one
// lacks) is fenced by its events only. A channel that cannot list its
// topics (RabbitMQ) is fenced on the peers of the other channel's, and on
// the topics this session fenced before; between two such channels, the
// topics that no event of this session reached are fenced by their
// events only.
func (s *session) fenceAll(ctx context.Context, tx *txn) error {
	rt := s.route
	if rt == nil || rt.step().Phase == migration.OldRetired {
		return nil
	}
	sides := []migration.Side{migration.OldSide, migration.NewSide}
	counts := map[migration.Side]map[string]int{}
	for _, side := range sides {
		c, err := s.metadata(ctx, rt.outs[side])
		if err != nil {
			return err
		}
		counts[side] = c
	}
	for _, side := range sides {
		out, peerOut := rt.outs[side], rt.outs[other(side)]
		if !out.layout.lists() {
			if err := s.countPeers(ctx, side, counts); err != nil {
				return err
			}
		}
		for _, topic := range slices.Sorted(maps.Keys(counts[side])) {
			r, ok := out.namer.parse(topic)
			if !ok {
				continue
			}
			peer := peerOut.namer.topic(r)
			if peer.problem != "" || !peerOut.namer.covers(out.namer) {
				continue
			}
			if e, ok := rt.fenced[fenceKey{side, topic}]; ok && e == rt.step().Epoch {
				continue
			}
			s.writeFences(out, topic, peer.name, counts[side][topic], tx)
		}
	}
	return nil
}

// countPeers adds to counts[side], for a channel that cannot list its
// topics, those of its topics that exist among the peers of the other
// channel's and the ones this session fenced before.
func (s *session) countPeers(ctx context.Context, side migration.Side, counts map[migration.Side]map[string]int) error {
	rt := s.route
	out, peerOut := rt.outs[side], rt.outs[other(side)]
	var names []string
	for topic := range counts[other(side)] {
		if r, ok := peerOut.namer.parse(topic); ok && out.namer.covers(peerOut.namer) {
			if t := out.namer.topic(r); t.problem == "" {
				names = append(names, t.name)
			}
		}
	}
	for key := range rt.fenced {
		if key.side == side {
			names = append(names, key.topic)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) == 0 {
		return nil
	}
	found, err := s.metadata(ctx, out, names...)
	if err != nil {
		return err
	}
	maps.Copy(counts[side], found)
	return nil
}

// writeFences produces the step's fence to each of topic's n partitions.
func (s *session) writeFences(out *channelOut, topic, peer string, n int, tx *txn) {
	rt := s.route
	st := rt.step()
	fence := []byte(route.Fence{Plan: rt.plan.Name, Epoch: st.Epoch, Side: out.side, Partitions: n, Peer: peer}.String())
	otherChannel := rt.plan.New
	if out.side == migration.NewSide {
		otherChannel = rt.plan.Old
	}
	value, _ := json.Marshal(otherChannel) // a struct of strings always marshals
	for part := range n {
		f := &fenceRecord{Context: s.sctx, out: out, tx: tx}
		f.rec = kgo.Record{Topic: topic, Partition: int32(part), Context: f, Value: value,
			Headers: []kgo.RecordHeader{{Key: route.HeaderFence, Value: fence}}}
		f.size = recordSize(&f.rec)
		if out.side == migration.NewSide && !out.track(f, tx, f.size, false) {
			return // given up (releaseNew)
		}
		s.tracker.produce(tx, f.size)
		out.sink.Produce(s.sctx, &f.rec, s.fenceAcked)
	}
	rt.fenced[fenceKey{out.side, topic}] = st.Epoch
	s.r.metrics.fences.Add(float64(n))
}

// metadata returns the partition (or shard) counts of topics on out that
// exist (of every topic it lists when none is named; see channelLayout).
// While the channel does not answer it retries in place, showing why in
// Ready; it runs off the loop (a pending call), which reads no further
// meanwhile but goes on sending status updates, so PostgreSQL keeps the
// connection however long the channel takes.
func (s *session) metadata(ctx context.Context, out *channelOut, topics ...string) (map[string]int, error) {
	retry := backoff.Sequence{Base: 250 * time.Millisecond, Ceiling: 5 * time.Second}
	defer s.r.fenceWait.Store(nil)
	what := "its topics"
	if len(topics) == 1 {
		what = fmt.Sprintf("topic %q", topics[0])
	}
	for {
		if out.side == migration.NewSide && s.releaseNew() {
			return map[string]int{}, nil // nothing to fence there any more
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		counts, err := out.layout.counts(lctx, topics...)
		cancel()
		if err == nil {
			return counts, nil
		}
		if errors.Is(err, errLayoutGone) {
			// As a publish on it would: the session ends, and the next
			// one starts from the confirmed position on a new connection.
			s.fail(fmt.Errorf("%s channel: cannot fence %s: %w", out.side, what, err))
			return nil, s.failErr
		}
		why := fmt.Sprintf("the %s channel does not answer a metadata request for %s, needed to fence it: %v", out.side, what, err)
		if s.r.fenceWait.Swap(&why) == nil {
			s.log.Warn("cannot fence for the live migration: waiting for the channel; nothing is confirmed past it",
				slog.String("side", string(out.side)), slog.String("topics", what), slog.String("error", err.Error()))
		}
		s.r.heartbeat()
		select {
		case <-s.failed:
			return nil, s.failErr
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.stopping:
			return nil, fmt.Errorf("stopped while waiting to fence %s on the %s channel", what, out.side)
		case <-time.After(retry.Next()):
		}
	}
}

// fenceAcked is the promise of every fence: a fence the channel refuses
// fails the session, which writes it again.
func (s *session) fenceAcked(rec *kgo.Record, err error) {
	f := rec.Context.(*fenceRecord)
	if f.out.side == migration.NewSide && !f.out.settle(f) {
		return // given up with its channel (releaseNew), acknowledged then
	}
	if err != nil {
		s.fail(fmt.Errorf("the %s channel refused a migration fence for topic %s partition %d: %w", f.out.side, rec.Topic, rec.Partition, err))
		return
	}
	s.tracker.ack(f.tx, f.size)
}

// fencePartitioner is the relay's partitioner: an event goes where its key
// hashes (Kafka's murmur2, as the Java client), a fence to the partition it
// names.
func fencePartitioner() kgo.Partitioner {
	keys := kgo.StickyKeyPartitioner(nil)
	return kgo.BasicConsistentPartitioner(func(topic string) func(*kgo.Record, int) int {
		tp := keys.ForTopic(topic)
		return func(r *kgo.Record, n int) int {
			if _, ok := r.Context.(*fenceRecord); ok {
				return int(r.Partition)
			}
			return tp.Partition(r, n)
		}
	})
}
