package migration

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// ReportTopic is the topic, on a plan's old channel, where workers publish
// their shadow reports (compacted: the newest report per plan and group is
// what counts); on a RabbitMQ old channel, a stream of that name that
// keeps them for ReportStreamMaxAge. Producer and consumers share no
// database: this is how the controller learns what the consumers saw.
const ReportTopic = "ferry.migration.reports"

// ReportStreamMaxAge is how long the report stream of a RabbitMQ old
// channel keeps a report (its x-max-age).
const ReportStreamMaxAge = "1D"

// reportIdle is how long a reader of the report stream waits for one more
// report before it takes the stream to be read: AMQP 0-9-1 tells a stream
// reader no end.
const reportIdle = time.Second

// Report is what a consumer group saw of a plan's events of which a copy
// arrived in the Window before At, each with both its copies wherever they
// arrived: the shadow gate's evidence, which so judges what holds now and
// not a stall long past. Every instance of the group computes it from the
// group's database, so any instance's newest report speaks for the group.
type Report struct {
	Plan  string    `json:"plan"`
	Group string    `json:"group"`
	At    time.Time `json:"at"`
	// Authoritative and Shadow count the copies received of each role.
	Authoritative int64 `json:"authoritative"`
	Shadow        int64 `json:"shadow"`
	// Checked counts the events whose two copies arrived.
	Checked int64 `json:"checked"`
	// Missing counts the authoritative copies received more than
	// AllowedLateness ago whose shadow never came.
	Missing         int64         `json:"missing"`
	AllowedLateness time.Duration `json:"allowed_lateness_ns"`
	// Window is how far back the report looks (the workers'
	// MigrationReportWindow, --migration-report-window): the copies
	// received in the Window before At count.
	Window time.Duration `json:"window_ns"`
	// MissingNewest is when the newest of the Missing copies arrived (zero
	// when none is missing).
	MissingNewest time.Time `json:"missing_newest,omitzero"`
	// Aged counts the authoritative copies received more than
	// AllowedLateness ago: those whose shadow could be missing.
	Aged int64 `json:"aged"`
	// Mismatched counts the checked events whose copies' payloads differ.
	Mismatched int64 `json:"mismatched"`
	// P99Lateness and MaxLateness are the delay between an event's two
	// copies, whichever came first.
	P99Lateness time.Duration `json:"p99_lateness_ns"`
	MaxLateness time.Duration `json:"max_lateness_ns"`
	// Late says, for lateness bounds (a few from 10ms to an hour, in
	// increasing order; only those some event exceeds), when the newest
	// event whose copies are further apart than the bound completed (its
	// later copy arrived): once that is older than the Window, no event in
	// the report is later than the bound.
	Late []LateMark `json:"late,omitempty"`
	// OldFenceEpoch is the newest epoch whose fences the group passed on
	// every partition of the old channel it consumes: it applied every
	// record the old channel held before them.
	OldFenceEpoch int `json:"old_fence_epoch"`
	// DuplicatesOld and DuplicatesNew count the authoritative copies, by
	// the channel that brought them, that arrived after their event was
	// applied: duplicates the inbox blocked (a bridged copy, a copy
	// brought again after a rollback). Copies of one channel brought again
	// (a relay's replay after a crash) are counted by the workers' metric
	// ferry_worker_migration_duplicates_total.
	DuplicatesOld int64 `json:"duplicates_old"`
	DuplicatesNew int64 `json:"duplicates_new"`
	// OldDeadLetters counts the messages the group dead-lettered on the
	// old channel since the migration began there (its first copy) and
	// never applied since: they go with the old cluster. -1: not counted
	// (the worker could not read the old channel's dead-letter topics up
	// to their end in time).
	OldDeadLetters int64 `json:"old_dead_letters"`
	// Quarantined counts the events the group received a shadow copy of
	// and never applied whose authoritative copy will not come (the group
	// consumed its partition past it), waiting in its quarantine to be
	// replayed.
	Quarantined int64 `json:"quarantined"`
	// Unwatched counts the partitions (or shard queues) where shadow
	// copies older than the quarantine's wait still wait for their
	// authoritative copy on a channel whose group position the worker
	// cannot read (RabbitMQ, or one it does not consume): neither applied
	// nor quarantined, they must not be left behind by OLD_RETIRED.
	Unwatched int64 `json:"unwatched,omitempty"`
	// Producers are the producers the group's worker saw on the old
	// channel since its previous report, on RabbitMQ (Kafka's are read
	// from the topics themselves: Producers).
	Producers []ProducerSeen `json:"producers,omitempty"`
	// OldWorkedAt is, on a RabbitMQ old channel, when the group last took
	// or tried to apply a message of it that the drain waits for: an
	// authoritative copy of that channel, or a message of a producer that
	// is not Ferry's on an exchange no bridge copies (zero: none since the
	// worker started). Read from a RabbitMQ channel's reports, it is the
	// newest of every instance's (Reports). OldQuiet is how long the old
	// channel must have brought none before the drain: the worker's
	// longest retry backoff plus its handler timeout, after which a
	// message taken earlier has been applied or dead-lettered.
	OldWorkedAt time.Time     `json:"old_worked_at,omitzero"`
	OldQuiet    time.Duration `json:"old_quiet_ns,omitempty"`
	// OldLag and NewLag are the group's lag on a RabbitMQ channel of the
	// plan: the messages its shard queues there hold ready plus the
	// deliveries its worker took and has not finished, as the worker last
	// read them (every few seconds). Nil when not read: a Kafka channel's
	// lag is read from the cluster.
	OldLag *int64 `json:"old_lag,omitempty"`
	NewLag *int64 `json:"new_lag,omitempty"`
}

// ProducerSeen is a producer a group saw on a RabbitMQ old channel: the
// messages of a topic published by a user, which the broker validated
// (the user the publishing connection logged in as; "" for a publisher
// that set no user id, which the broker does not check).
type ProducerSeen struct {
	Topic   string    `json:"topic"`
	User    string    `json:"user"`
	Records int64     `json:"records"`
	Last    time.Time `json:"last"`
}

// LateMark is one of Report.Late.
type LateMark struct {
	Over   time.Duration `json:"over_ns"`
	Newest time.Time     `json:"newest"`
}

// Key is the report's record key: the plan and the group.
func (r Report) Key() string { return r.Plan + "/" + r.Group }

// Gate returns nil when the report passes the shadow gate: events checked,
// none missing beyond the allowed lateness, no payload mismatch, p99
// lateness within maxP99; else what fails. When only lateness fails (p99,
// missing shadows), it also says by when the gate passes if no copy is
// late from then on: once the late copies are older than the Window.
func (r Report) Gate(maxP99 time.Duration) error {
	var why []string
	if r.Checked == 0 {
		why = append(why, "no event checked yet (no event with both copies)")
	}
	if r.Aged == 0 {
		why = append(why, fmt.Sprintf("no authoritative copy older than the allowed lateness of %s yet: no missing shadow could show", r.AllowedLateness))
	}
	if r.Missing > 0 {
		why = append(why, fmt.Sprintf("%d shadow copies missing beyond the allowed lateness of %s", r.Missing, r.AllowedLateness))
	}
	if r.Mismatched > 0 {
		why = append(why, fmt.Sprintf("%d payload mismatches", r.Mismatched))
	}
	if r.P99Lateness > maxP99 {
		why = append(why, fmt.Sprintf("p99 lateness %s above %s", r.P99Lateness, maxP99))
	}
	if len(why) == 0 {
		return nil
	}
	msg := strings.Join(why, "; ")
	if by, ok := r.passesBy(maxP99); ok {
		msg += fmt.Sprintf("; if no copy is late from now on, the gate passes by %s, once the late copies are older than the reports' window of %s "+
			"(the workers' --migration-report-window)", by.UTC().Format(time.RFC3339), r.Window)
	} else if r.Window > 0 && (r.Missing > 0 || r.P99Lateness > maxP99) {
		msg += fmt.Sprintf(" (over the copies of the last %s: the workers' --migration-report-window)", r.Window)
	}
	return errors.New(msg)
}

// passesBy returns when the report's late copies (beyond maxP99, or
// missing their shadow) leave its window, when lateness is all that fails
// it and the report says when they came; false otherwise.
func (r Report) passesBy(maxP99 time.Duration) (time.Time, bool) {
	p99 := r.P99Lateness > maxP99
	if r.Window <= 0 || r.Checked == 0 || r.Aged == 0 || r.Mismatched > 0 || (!p99 && r.Missing == 0) {
		return time.Time{}, false
	}
	var last time.Time
	if r.Missing > 0 {
		if r.MissingNewest.IsZero() {
			return time.Time{}, false
		}
		last = r.MissingNewest
	}
	if p99 {
		// The newest event later than the largest bound within maxP99 is
		// no older than the newest later than maxP99: a bound by which the
		// gate passes at the latest.
		var mark *LateMark
		for i := range r.Late {
			if r.Late[i].Over <= maxP99 {
				mark = &r.Late[i]
			}
		}
		if mark == nil {
			return time.Time{}, false
		}
		last = maxTime(last, mark.Newest)
	}
	return last.Add(r.Window), true
}

// ReportEvidence is the controller's Evidence from the plan's old channel:
// the consumer groups' newest reports (ReportTopic), on Kafka or RabbitMQ.
type ReportEvidence struct {
	// MaxP99Lateness bounds a report's p99 lateness.
	MaxP99Lateness time.Duration
	// MaxAge is how old the newest report may be.
	MaxAge time.Duration
	// MaxOldDeadLetters is how many messages a group may have left
	// dead-lettered on the old channel, never applied, when it leaves it
	// (Report.OldDeadLetters): 0 unless the operator keeps them elsewhere.
	MaxOldDeadLetters int64
	// Getenv reads the variables a channel names for its SASL password;
	// os.Getenv when nil.
	Getenv func(string) string
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

func (e *ReportEvidence) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

func (e *ReportEvidence) getenv() func(string) string {
	if e.Getenv != nil {
		return e.Getenv
	}
	return os.Getenv
}

func (e *ReportEvidence) client(p Plan, opts ...kgo.Opt) (*kgo.Client, error) {
	base, err := p.Old.KafkaOpts("old", e.getenv())
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(append(base, opts...)...)
}

// ShadowGate reads the group's newest report and applies Report.Gate.
func (e *ReportEvidence) ShadowGate(ctx context.Context, p Plan, group string) error {
	reports, err := e.Reports(ctx, p)
	if err != nil {
		return err
	}
	r, ok := reports[group]
	switch {
	case !ok:
		return fmt.Errorf("no report from the group on %s (is a worker of it running with the migration's tables?)", ReportTopic)
	case e.now().Sub(r.At) > e.MaxAge:
		return fmt.Errorf("its newest report is from %s, older than %s", r.At.UTC().Format(time.RFC3339), e.MaxAge)
	}
	return r.Gate(e.MaxP99Lateness)
}

// Reports returns the newest report of each group of plan p.
func (e *ReportEvidence) Reports(ctx context.Context, p Plan) (map[string]Report, error) {
	if p.Old.KindOf() == RabbitMQ {
		return e.rabbitReports(ctx, p)
	}
	cl, err := e.client(p, kgo.ConsumeTopics(ReportTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, ReportTopic)
	if err != nil {
		return nil, fmt.Errorf("read the end of %s on the old channel: %w", ReportTopic, err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	out := map[string]Report{}
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read %s: %w", ReportTopic, err)
		}
		fs.EachRecord(func(rec *kgo.Record) {
			if end, ok := want[rec.Partition]; ok && rec.Offset+1 >= end {
				delete(want, rec.Partition)
			}
			var r Report
			if json.Unmarshal(rec.Value, &r) != nil || r.Plan != p.Name || string(rec.Key) != r.Key() {
				return
			}
			if old, ok := out[r.Group]; !ok || r.At.After(old.At) {
				out[r.Group] = r
			}
		})
	}
	return out, nil
}

// rabbitReports reads the report stream of a RabbitMQ old channel, from
// well before the oldest report the gates take (twice MaxAge, at least 10
// minutes): the newest report of each group in that time, with the
// newest OldWorkedAt of any of its reports (each instance of a group
// reports the messages it took).
func (e *ReportEvidence) rabbitReports(ctx context.Context, p Plan) (map[string]Report, error) {
	out := map[string]Report{}
	worked := map[string]time.Time{}
	err := e.readReportStream(ctx, p, e.now().Add(-max(2*e.MaxAge, 10*time.Minute)), func(r Report) {
		if r.OldWorkedAt.After(worked[r.Group]) {
			worked[r.Group] = r.OldWorkedAt
		}
		if old, ok := out[r.Group]; !ok || r.At.After(old.At) {
			out[r.Group] = r
		}
	})
	for g, r := range out {
		r.OldWorkedAt = worked[g]
		out[g] = r
	}
	return out, err
}

// SeenProducers returns the producers the groups of plan p saw on its
// RabbitMQ old channel in the window before now, by topic and user, with
// their records and when the last one came, from every report in that
// window (each instance of a group reports what it consumed). The report
// stream keeps a day (ReportStreamMaxAge): a longer window reads that.
func (e *ReportEvidence) SeenProducers(ctx context.Context, p Plan, window time.Duration) ([]ProducerSeen, error) {
	if p.Old.KindOf() != RabbitMQ {
		return nil, fmt.Errorf("migration: the old channel is %s: its producers are read from its topics (Producers)", p.Old.KindOf())
	}
	type key struct{ topic, user string }
	sum := map[key]*ProducerSeen{}
	err := e.readReportStream(ctx, p, e.now().Add(-window), func(r Report) {
		for _, ps := range r.Producers {
			k := key{ps.Topic, ps.User}
			if sum[k] == nil {
				sum[k] = &ProducerSeen{Topic: ps.Topic, User: ps.User}
			}
			sum[k].Records += ps.Records
			if ps.Last.After(sum[k].Last) {
				sum[k].Last = ps.Last
			}
		}
	})
	if err != nil {
		return nil, err
	}
	out := make([]ProducerSeen, 0, len(sum))
	for _, ps := range sum {
		out = append(out, *ps)
	}
	slices.SortFunc(out, func(a, b ProducerSeen) int { return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.User, b.User)) })
	return out, nil
}

// readReportStream calls fn with each report of plan p on the report
// stream of its RabbitMQ old channel written from about from. AMQP tells a
// stream reader no end, and workers append a report every few seconds: it
// reads up to the first report published (by the publisher's clock) after
// it began, or until none came for reportIdle.
func (e *ReportEvidence) readReportStream(ctx context.Context, p Plan, from time.Time, fn func(Report)) error {
	pc := p.Old.rabbitPlan("old")
	conn, err := pc.Conn(e.getenv())
	if err != nil {
		return fmt.Errorf("migration: %w", err)
	}
	amqpConn, err := conn.Dial(pc.Names())
	if err != nil {
		return fmt.Errorf("read %s on the old channel: %w", ReportTopic, err)
	}
	defer func() { _ = amqpConn.CloseDeadline(time.Now().Add(5 * time.Second)) }()
	if _, exists, err := rabbitmq.Inspect(amqpConn, ReportTopic); err != nil || !exists {
		return err // no worker reported yet
	}
	began := time.Now()
	err = rabbitmq.ReadStreamFrom(ctx, amqpConn, ReportTopic, from, reportIdle, func(d *amqp.Delivery) bool {
		if d.Timestamp.After(began) {
			return false // written after the reading began: the end as it was
		}
		var r Report
		if json.Unmarshal(d.Body, &r) == nil && r.Plan == p.Name && d.MessageId == r.Key() {
			fn(r)
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("read %s on the old channel: %w", ReportTopic, err)
	}
	return nil
}

// Drained returns nil when the group's newest report says it passed the
// fences of epoch (or later) on every partition of the old channel: it
// applied every record the old channel was authoritative for.
func (e *ReportEvidence) Drained(ctx context.Context, p Plan, group string, epoch int) error {
	reports, err := e.Reports(ctx, p)
	if err != nil {
		return err
	}
	r, ok := reports[group]
	switch {
	case !ok:
		return fmt.Errorf("no report from the group on %s", ReportTopic)
	case e.now().Sub(r.At) > e.MaxAge:
		return fmt.Errorf("its newest report is from %s, older than %s", r.At.UTC().Format(time.RFC3339), e.MaxAge)
	case r.Quarantined > 0:
		return fmt.Errorf("%d events wait in its migration quarantine (never applied): replay them first (worker migration quarantine replay)", r.Quarantined)
	case r.OldDeadLetters < 0:
		return errors.New("its dead letters on the old channel are not counted yet (the worker reads its dead-letter topics there)")
	case r.OldDeadLetters > e.MaxOldDeadLetters:
		return fmt.Errorf("%d messages it dead-lettered on the old channel since the migration began were never applied, and the old "+
			"cluster takes them with it: redrive them once their cause is fixed (worker dlq redrive), or keep them elsewhere and "+
			"accept up to that many (--max-old-dead-letters %d)", r.OldDeadLetters, r.OldDeadLetters)
	case r.Unwatched > 0:
		return fmt.Errorf("on %d partitions or shard queues its shadow copies wait, longer than its migration quarantine waits, for an "+
			"authoritative copy on a channel whose position it cannot read (RabbitMQ): they may be lost there. Wait while it catches "+
			"up; if they stay, step the plan back and forth (%s, then %s again): the fences of the later step show which were lost, "+
			"and they go to the migration quarantine", r.Unwatched, DualWrite, Cutover)
	case r.OldFenceEpoch < epoch:
		return fmt.Errorf("it passed the old channel's fences up to epoch %d on every partition, not yet %d (from which every slice is on the new channel)",
			r.OldFenceEpoch, epoch)
	}
	if p.Old.KindOf() == RabbitMQ {
		return oldQuiet(r)
	}
	return nil
}

// oldQuiet returns nil when a RabbitMQ old channel brought the group
// nothing to apply for OldQuiet before its report: one reading of an
// empty queue proves nothing, a message taken and still being retried
// is in no queue.
func oldQuiet(r Report) error {
	switch quiet := r.At.Sub(r.OldWorkedAt); {
	case r.OldQuiet <= 0:
		return errors.New("its report does not say how long its RabbitMQ old channel has been quiet (a worker older than this release): " +
			"upgrade the group's workers")
	case !r.OldWorkedAt.IsZero() && quiet < r.OldQuiet:
		return fmt.Errorf("it took a message of the old channel to apply at %s, %s before its report, and that channel must bring it "+
			"nothing to apply for %s (its --retry-backoff-max plus --handler-timeout): wait; a producer that is not Ferry's and still "+
			"publishes there must move to the new channel, or be bridged (relay bridge) before OLD_RETIRED",
			r.OldWorkedAt.UTC().Format(time.RFC3339Nano), quiet.Round(time.Millisecond), r.OldQuiet)
	}
	return nil
}
