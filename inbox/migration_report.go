package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
)

// reportLoop publishes, every Config.MigrationReportInterval, each
// consumer's shadow report of every plan it follows (migration.Report) to
// migration.ReportTopic on its own (the old) channel, where the migration
// controller reads it for the shadow gate.
func (w *Worker) reportLoop(ctx context.Context, groups []*groupConsumer) {
	w.deadLetterTail = newDeadLetterTail(w, groups)
	w.everyReportInterval(ctx, groups, w.report, "live migration: cannot publish the shadow report; the controller sees the previous one",
		slog.String("topic", migration.ReportTopic))
}

// everyReportInterval calls pass for each group every
// Config.MigrationReportInterval until ctx ends; a failed pass is logged
// at WARN with failed and attrs, and the next one tries again.
func (w *Worker) everyReportInterval(ctx context.Context, groups []*groupConsumer, pass func(context.Context, *groupConsumer) error,
	failed string, attrs ...slog.Attr) {
	t := time.NewTicker(w.cfg.MigrationReportInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, g := range groups {
			if err := pass(ctx, g); err != nil && ctx.Err() == nil {
				g.log.LogAttrs(ctx, slog.LevelWarn, failed, append(attrs, slog.String("error", err.Error()))...)
			}
		}
	}
}

// report computes and publishes g's reports.
func (w *Worker) report(ctx context.Context, g *groupConsumer) error {
	var reports []migration.Report
	var since []time.Time       // of each report: when the migration began at g
	at := w.reportClock().UTC() // before the snapshot: a report is as old as what it read
	copies := w.reportWindows[g.name]
	if copies == nil {
		copies = &reportWindow{}
		w.reportWindows[g.name] = copies
	}
	defer copies.drop(at.Add(-w.cfg.MigrationReportWindow - w.cfg.MigrationReportInterval))
	err := pgx.BeginFunc(ctx, w.cfg.DB, func(tx pgx.Tx) error {
		plans, err := w.queries.InboxCopyPlans(ctx, tx, g.name)
		if err != nil || len(plans) == 0 {
			return err
		}
		if err := copies.update(ctx, w.queries, tx, g.name, plans, at.Add(-w.cfg.MigrationReportWindow)); err != nil {
			return err
		}
		for _, plan := range plans {
			quarantined, err := w.queries.InboxQuarantineCount(ctx, tx, dbsqlc.InboxQuarantineCountParams{Consumer: g.name, Plan: plan})
			if err != nil {
				return err
			}
			row := copies.report(plan, at, w.cfg.MigrationReportWindow, w.cfg.MigrationAllowedLateness, lateBounds)
			floor, err := w.queries.InboxFenceFloor(ctx, tx, dbsqlc.InboxFenceFloorParams{Consumer: g.name, Plan: plan})
			if err != nil {
				return err
			}
			began, err := w.queries.InboxCopySince(ctx, tx, dbsqlc.InboxCopySinceParams{Consumer: g.name, Plan: plan})
			if err != nil {
				return err
			}
			since = append(since, began)
			reports = append(reports, migration.Report{Plan: plan, Group: g.name, At: at, OldFenceEpoch: int(floor), Quarantined: quarantined,
				Authoritative: row.Authoritative, Shadow: row.Shadow, Checked: row.Checked, Missing: row.Missing, Aged: row.Aged,
				AllowedLateness: w.cfg.MigrationAllowedLateness, Window: w.cfg.MigrationReportWindow, Mismatched: row.Mismatched,
				P99Lateness: seconds(row.P99Seconds), MaxLateness: seconds(row.MaxSeconds),
				MissingNewest: epochTime(row.MissingNewest), Late: lateMarks(row.LateOver, row.LateNewest),
				DuplicatesOld: row.DuplicatesOld, DuplicatesNew: row.DuplicatesNew})
			w.metrics.migrationLateness.WithLabelValues(g.name, plan, "0.99").Set(row.P99Seconds)
			w.metrics.migrationLateness.WithLabelValues(g.name, plan, "1").Set(row.MaxSeconds)
		}
		return nil
	})
	if err != nil || len(reports) == 0 {
		return err
	}
	for i := range reports {
		reports[i].OldDeadLetters = w.oldDeadLetters(ctx, g, since[i])
		reports[i].Unwatched = w.unwatchedOf(g.name, reports[i].Plan)
	}
	for i := range reports {
		if f := w.follower(g.name, reports[i].Plan); f != nil {
			reports[i].NewLag = rabbitLag(f)
		}
	}
	if rs, ok := g.src.(*rabbitSource); ok {
		for i := range reports {
			reports[i].OldWorkedAt, reports[i].OldQuiet = w.oldWork.lastOf(g.name).UTC(), w.oldQuiet()
			reports[i].OldLag = rabbitLag(g)
		}
		return rs.publishReports(ctx, reports)
	}
	recs := make([]*kgo.Record, len(reports))
	for i, r := range reports {
		v, _ := json.Marshal(r) // numbers, strings and a time always marshal
		recs[i] = &kgo.Record{Topic: migration.ReportTopic, Key: []byte(r.Key()), Value: v}
	}
	err = g.kafka().ProduceSync(ctx, recs...).FirstErr()
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		// The first report of a cluster: a compacted topic keeps the newest
		// report per plan and group.
		_, cerr := kadm.NewClient(g.kafka()).CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": new("compact")}, migration.ReportTopic)
		if cerr == nil || errors.Is(cerr, kerr.TopicAlreadyExists) {
			err = g.kafka().ProduceSync(ctx, recs...).FirstErr()
		}
	}
	return err
}

// rabbitLag is g's lag on its RabbitMQ channel (Report.OldLag, NewLag);
// nil on Kafka, or before every shard queue was read.
func rabbitLag(g *groupConsumer) *int64 {
	rs, ok := g.src.(*rabbitSource)
	if !ok {
		return nil
	}
	if lag, ok := rs.lagTotal(); ok {
		return &lag
	}
	return nil
}

// follower is consumer's group on plan's new channel; nil when the worker
// does not follow it.
func (w *Worker) follower(consumer, plan string) *groupConsumer {
	w.routeMu.Lock()
	defer w.routeMu.Unlock()
	return w.followers[followKey{consumer, plan}]
}

// oldDeadLetters counts the messages consumer dead-lettered on its own
// cluster (the old channel) at or after since and never applied since; -1
// when they cannot be counted now.
func (w *Worker) oldDeadLetters(ctx context.Context, g *groupConsumer, since time.Time) int64 {
	consumer := g.name
	var ids []string
	ok := false
	if rs, isRabbit := g.src.(*rabbitSource); isRabbit {
		ids, ok = rs.deadLetters(ctx, since)
	} else {
		w.deadLetterTail.start(ctx)
		ids, ok = w.deadLetterTail.deadLetters(ctx, consumer, since)
	}
	if !ok {
		return -1
	}
	if len(ids) == 0 {
		return 0
	}
	var n int64
	err := pgx.BeginFunc(ctx, w.cfg.DB, func(tx pgx.Tx) error {
		var err error
		n, err = w.queries.InboxNotApplied(ctx, tx, dbsqlc.InboxNotAppliedParams{Consumer: consumer, Ids: ids})
		return err
	})
	if err != nil {
		return -1
	}
	return n
}

// reportClock is the time a report is made at: now, or a test's clock.
func (w *Worker) reportClock() time.Time {
	if h := w.cfg.hooks.reportClock; h != nil {
		return h()
	}
	return time.Now()
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// lateBounds are route.LateBounds in seconds, for the report query.
var lateBounds = func() []float64 {
	out := make([]float64, len(route.LateBounds))
	for i, b := range route.LateBounds {
		out[i] = b.Seconds()
	}
	return out
}()

// epochTime is a time from seconds since the Unix epoch (0: zero).
func epochTime(s float64) time.Time {
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(s*float64(time.Second))).UTC()
}

func lateMarks(over, newest []float64) []migration.LateMark {
	out := make([]migration.LateMark, 0, len(over))
	for i := range min(len(over), len(newest)) {
		out = append(out, migration.LateMark{Over: seconds(over[i]), Newest: epochTime(newest[i])})
	}
	return out
}
