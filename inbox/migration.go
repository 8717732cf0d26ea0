package inbox

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/kafkaauth"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
)

// A worker follows a live broker migration by itself (package migration);
// nothing in its configuration names the migration. What it must know comes
// through the channels, and what it learns lives in its database, shared by
// every instance of a consumer group:
//
//   - A fence (route.HeaderFence) on a partition is passed once every
//     record before it there is finished; the worker then records it
//     (ferry_inbox_fence). A fence on the old channel names the new
//     channel and the topic of the same events there: the worker remembers
//     it (ferry_inbox_channel) and consumes that topic too, in the same
//     consumer group on the new cluster, with the same handler.
//   - A shadow copy (route.Shadow) is recorded (ferry_inbox_copy: when
//     it arrived, a digest of its payload) and never applied.
//   - An authoritative copy is recorded the same way and applied through
//     the inbox as any message, so a message is applied once whichever
//     channel brings it. One whose side holds its slice since epoch e > 0
//     (Stamp.Since) waits until every partition of its peer topic on the
//     other channel passed a fence of epoch e or later: every copy the
//     other side was authoritative for was written before those fences,
//     so an aggregate's events are applied in order across the channels
//     without version checks in the effect.

// routeOf reads a record's migration headers: its stamp, or the fence it
// is. Both nil: a record outside any migration. A malformed one is an
// error: the consumer acts on it, so it is dead-lettered, never guessed.
func routeOf(r *kgo.Record) (*route.Stamp, *route.Fence, error) {
	var st *route.Stamp
	var f *route.Fence
	for _, h := range r.Headers {
		switch h.Key {
		case route.HeaderRoute:
			if st != nil || f != nil {
				return nil, nil, fmt.Errorf("header %q appears more than once, or beside %q", h.Key, route.HeaderFence)
			}
			v, err := route.ParseStamp(string(h.Value))
			if err != nil {
				return nil, nil, err
			}
			st = &v
		case route.HeaderFence:
			if st != nil || f != nil {
				return nil, nil, fmt.Errorf("header %q appears more than once, or beside %q", h.Key, route.HeaderRoute)
			}
			v, err := route.ParseFence(string(h.Value))
			if err != nil {
				return nil, nil, err
			}
			f = &v
		}
	}
	return st, f, nil
}

// followRoute handles what a migration's headers say before a record is
// applied. It reports whether the record goes on to be applied (apply) and
// false for ok when the partition stopped first.
func (p *partition) followRoute(f fetched, st *route.Stamp, fence *route.Fence) (apply, ok bool) {
	switch {
	case fence != nil:
		if !p.passFence(f.rec, fence) {
			return false, false
		}
		p.finish(f.rec)
		return false, true
	case st == nil:
		return true, true
	}
	if st.Role == route.Shadow {
		params, ok := p.copyParams(f, st)
		if !ok {
			return true, true // no usable id: dead-lettered by apply, like any message
		}
		p.w.metrics.migrationCopies.WithLabelValues(p.g.name, string(st.Side), string(st.Role)).Inc()
		// Recorded in batches; finished once recorded (shadow_writer.go).
		return false, p.w.shadows.add(p, f.rec, params)
	}
	if st.Since > 0 && !p.awaitFences(st) {
		return false, false
	}
	p.w.metrics.migrationCopies.WithLabelValues(p.g.name, string(st.Side), string(st.Role)).Inc()
	return true, true
}

// passFence records a fence once every record before it on the partition
// is finished, and learns the other channel from a fence of the old one.
func (p *partition) passFence(r *kgo.Record, fence *route.Fence) bool {
	if fence.Side == migration.OldSide {
		if !p.retryDB("learn the new channel of migration "+fence.Plan, func(ctx context.Context, tx pgx.Tx) error {
			return p.w.learnChannel(ctx, tx, p.g.name, p.topic, r.Value, fence)
		}) {
			return false
		}
	}
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		p.mu.Lock()
		next, unfinished := p.tracker.NextUnfinished()
		p.mu.Unlock()
		if !unfinished || next >= r.Offset {
			break
		}
		if !p.sleep(wait) {
			return false
		}
	}
	if !p.retryDB("record a migration fence", func(ctx context.Context, tx pgx.Tx) error {
		return p.w.queries.InboxFencePassed(ctx, tx, dbsqlc.InboxFencePassedParams{
			Consumer: p.g.name, Plan: fence.Plan, Side: string(fence.Side), Topic: p.topic,
			Partition: p.id, Epoch: int32(fence.Epoch), Partitions: int32(fence.Partitions)})
	}) {
		return false
	}
	p.w.metrics.migrationFences.WithLabelValues(p.g.name, string(fence.Side)).Inc()
	return true
}

// copyParams is the ferry_inbox_copy row of a stamped copy: its arrival
// and payload digest, and a shadow's record, which stands in for a lost
// authoritative copy (migration_quarantine.go). false: no usable id.
func (p *partition) copyParams(f fetched, st *route.Stamp) (dbsqlc.InboxCopyInsertParams, bool) {
	m, bad := newMessage(p.g.name, f.rec, p.w.cfg.IDFromPayloadHash, f.received)
	if bad != nil {
		return dbsqlc.InboxCopyInsertParams{}, false
	}
	digest := sha256.Sum256(f.rec.Value)
	params := dbsqlc.InboxCopyInsertParams{
		Consumer: p.g.name, MessageID: m.ID, Plan: st.Plan, Side: string(st.Side), Role: string(st.Role),
		Epoch: int32(st.Epoch), Digest: digest[:], ReceivedAt: f.received, Alone: st.Alone()}
	if st.Role == route.Shadow {
		params.Topic = pgtype.Text{String: f.rec.Topic, Valid: true}
		params.Partition = pgtype.Int4{Int32: f.rec.Partition, Valid: true}
		params.RecordOffset = pgtype.Int8{Int64: f.rec.Offset, Valid: true}
		params.RecordKey, params.RecordValue = f.rec.Key, f.rec.Value
		params.RecordHeaders = encodeHeaders(f.rec.Headers)
	}
	return params, true
}

// awaitFences holds an authoritative copy until every partition of its
// peer topic on the other channel passed a fence of epoch Since or later.
func (p *partition) awaitFences(st *route.Stamp) bool {
	other := migration.OldSide
	if st.Side == migration.OldSide {
		other = migration.NewSide
	}
	key := fenceWait{p.g.name, st.Plan, other, st.Peer}
	if p.w.fencesPassed(key) >= st.Since {
		return true
	}
	held := false
	defer func() {
		if held {
			p.unstick()
		}
	}()
	work := p.drainWork(st)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		if work {
			p.w.oldWork.touch(p.g.name) // held, not applied yet
		}
		var row *dbsqlc.InboxFencesAtLeastRow
		if !p.retryDB("read the migration fences passed", func(ctx context.Context, tx pgx.Tx) error {
			var err error
			row, err = p.w.queries.InboxFencesAtLeast(ctx, tx, dbsqlc.InboxFencesAtLeastParams{
				Consumer: p.g.name, Plan: st.Plan, Side: string(other), Topic: st.Peer, Epoch: int32(st.Since)})
			return err
		}) {
			return false
		}
		if row.Partitions > 0 && row.Passed >= row.Partitions {
			p.w.fencesSeen(key, st.Since)
			return true
		}
		if !held {
			held = true
			p.stick(fmt.Sprintf("holding a message of the migration until the fences of epoch %d on every partition of %s (the %s channel) are passed: %d of %d",
				st.Since, st.Peer, other, row.Passed, row.Partitions))
			p.w.metrics.migrationHeld.WithLabelValues(p.g.name).Inc()
		}
		if !p.sleep(wait) {
			return false
		}
	}
}

// fenceWait names the fences an authoritative copy waits for.
type fenceWait struct {
	consumer, plan string
	side           migration.Side
	topic          string
}

// fencesPassed returns the newest epoch whose fences the worker knows
// passed on every partition of k's topic (0: none known).
func (w *Worker) fencesPassed(k fenceWait) int {
	w.routeMu.Lock()
	defer w.routeMu.Unlock()
	return w.passed[k]
}

func (w *Worker) fencesSeen(k fenceWait, epoch int) {
	w.routeMu.Lock()
	defer w.routeMu.Unlock()
	if epoch > w.passed[k] {
		w.passed[k] = epoch
	}
}

// retryDB runs fn in a transaction until it commits, retrying database
// failures with backoff; false when the partition stopped first.
func (p *partition) retryDB(what string, fn func(ctx context.Context, tx pgx.Tx) error) bool {
	for failures := 0; ; {
		err := pgx.BeginFunc(p.workCtx, p.w.cfg.DB, func(tx pgx.Tx) error { return fn(p.workCtx, tx) })
		if err == nil {
			p.w.dbAnswered()
			return true
		}
		if p.stopCtx.Err() != nil {
			return false
		}
		failures++
		wait := backoff.Delay(failures, p.w.cfg.RetryBackoff, p.w.cfg.RetryBackoffMax)
		p.log.Warn("cannot "+what+"; retrying", slog.String("error", err.Error()), slog.Duration("retry_in", wait))
		if !p.sleep(wait) {
			return false
		}
	}
}

// learnChannel remembers the channel a fence of the old channel names and,
// the first time, starts consuming its peer topic there.
func (w *Worker) learnChannel(ctx context.Context, tx pgx.Tx, consumer, topic string, value []byte, fence *route.Fence) error {
	var ch migration.Channel
	if err := json.Unmarshal(value, &ch); err != nil {
		return fmt.Errorf("migration %s: the fence on %s does not carry a channel: %w", fence.Plan, topic, err)
	}
	n, err := w.queries.InboxChannelLearn(ctx, tx, dbsqlc.InboxChannelLearnParams{
		Consumer: consumer, Plan: fence.Plan, Side: string(fence.Side), Topic: topic, Peer: fence.Peer, Channel: value})
	if err != nil {
		return err
	}
	if n == 0 && w.following(consumer, fence.Plan, fence.Peer) {
		return nil
	}
	return w.follow(consumer, fence.Plan, topic, fence.Peer, ch)
}

// followKey names a consumer's group on a migration's new channel.
type followKey struct{ consumer, plan string }

// following reports whether the worker consumes peer on the plan's new
// channel already.
func (w *Worker) following(consumer, plan, peer string) bool {
	w.routeMu.Lock()
	defer w.routeMu.Unlock()
	g := w.followers[followKey{consumer, plan}]
	return g != nil && g.handles(peer)
}

// follow consumes peer, the new channel's topic of the events of topic, in
// consumer's group on the new channel's cluster, with topic's handler.
func (w *Worker) follow(consumer, plan, topic, peer string, ch migration.Channel) error {
	h, ok := w.handlerOf(consumer, topic)
	if !ok {
		return fmt.Errorf("migration %s: consumer %s has no handler for %s", plan, consumer, topic)
	}
	w.routeMu.Lock()
	defer w.routeMu.Unlock()
	k := followKey{consumer, plan}
	if g := w.followers[k]; g != nil {
		if !g.handles(peer) {
			g.addTopic(peer, h)
			g.log.Info("live migration: consuming another topic of the new channel", slog.String("topic", peer), slog.String("for", topic))
		}
		return nil
	}
	if w.runCtx == nil || w.runCtx.Err() != nil {
		return nil // not running: Run starts the followers it finds in ferry_inbox_channel
	}
	g, err := w.newFollower(consumer, plan, peer, h, ch)
	if err != nil {
		return err
	}
	g.log = g.log.With(slog.String("migration", plan), slog.String("channel", "new"))
	g.follower = true
	w.followers[k] = g
	g.brokerOK.Store(time.Now().UnixNano())
	gs := append(slices.Clone(*w.groups.Load()), g)
	w.groups.Store(&gs)
	w.runWG.Go(func() { g.run(w.runCtx) })
	g.log.Info("live migration: consuming the new channel too", slog.String("kind", string(ch.KindOf())), slog.String("at", ch.Where()),
		slog.String("topic", peer), slog.String("for", topic))
	return nil
}

// newFollower is consumer's group on plan's new channel ch, consuming
// peer with h: a Kafka consumer group on its cluster, or the consumer's
// shard queues on its RabbitMQ broker (which the plan's DUAL_WRITE
// required to exist; they are never declared here).
func (w *Worker) newFollower(consumer, plan, peer string, h handling, ch migration.Channel) (*groupConsumer, error) {
	handlers := map[string]handling{peer: h}
	if ch.KindOf() == migration.RabbitMQ {
		conn, err := rabbitmq.PlanChannel{Side: "new", URL: ch.URL, PasswordEnv: ch.PasswordEnv,
			TLS: kafkaauth.TLSFiles{CA: ch.TLSCAFile, Cert: ch.TLSCertFile, Key: ch.TLSKeyFile}}.Conn(os.Getenv)
		if err != nil {
			return nil, fmt.Errorf("migration %s: cannot reach the new channel: %w", plan, err)
		}
		rc := RabbitMQConfig{URL: conn.URL, Password: conn.Password, TLSCAFile: conn.TLS.CA, TLSCertFile: conn.TLS.Cert,
			TLSKeyFile: conn.TLS.Key, Shards: ch.Shards, NoCreate: true, Name: "ferry-worker-" + plan}
		if own := w.cfg.RabbitMQ; own != nil {
			rc.Prefetch, rc.DeliveryLimit = own.Prefetch, own.DeliveryLimit
		}
		rc = rc.withDefaults()
		if err := rc.validate(); err != nil {
			return nil, fmt.Errorf("migration %s: the new channel: %w", plan, err)
		}
		g := newConsumer(w, consumer, handlers)
		g.src = newRabbitSource(g, &rc)
		return g, nil
	}
	opts, err := ch.KafkaOpts("new", os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("migration %s: cannot reach the new channel: %w", plan, err)
	}
	return newGroupConsumer(w, consumer, handlers, channelKafkaOpts(w.cfg.KafkaOpts, opts))
}

// handlerOf returns consumer's handler of topic, with the middleware.
func (w *Worker) handlerOf(consumer, topic string) (handling, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, ok := w.handlers[consumer][topic]
	if !ok {
		return handling{}, false
	}
	return handling{handler: Chain(h.handler, w.middleware...), locks: h.locks}, true
}

// followKnown starts, at Run, consuming the new channels the consumers
// learned of before (read by checkSchema). One that cannot be reached is
// logged; its fences come again and retry it.
func (w *Worker) followKnown() {
	for _, r := range w.known {
		if r.Side != string(migration.OldSide) {
			continue
		}
		var ch migration.Channel
		err := json.Unmarshal(r.Channel, &ch)
		if err == nil {
			err = w.follow(r.Consumer, r.Plan, r.Topic, r.Peer, ch)
		}
		if err != nil {
			w.cfg.Logger.Error("live migration: cannot consume a known new channel", slog.String("consumer", r.Consumer),
				slog.String("plan", r.Plan), slog.String("topic", r.Peer), slog.String("error", err.Error()))
		}
	}
}
