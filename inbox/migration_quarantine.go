package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/outbox"
)

// MigrationQuarantined is an event of a live migration a consumer received
// as a shadow copy and never applied: its authoritative copy was lost on
// the other channel (or is late beyond MigrationQuarantineAfter). It waits
// in ferry_inbox_quarantine with the shadow's record, which stands in for
// the lost copy: ReplayMigrationQuarantined applies it, once. An entry
// whose authoritative copy is applied after all leaves by itself. OLD_RETIRED
// is refused while a group's quarantine is not empty (its report says how
// many).
type MigrationQuarantined struct {
	Consumer  string
	ID        string
	Plan      string
	Side      migration.Side // the channel the shadow came from
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []kgo.RecordHeader
	Reason    string
	Received  time.Time
	At        time.Time
}

// storedHeader is a record header in ferry_inbox_copy and
// ferry_inbox_quarantine (record_headers: a JSON array).
type storedHeader struct {
	Key   string `json:"k"`
	Value []byte `json:"v"`
}

func encodeHeaders(hs []kgo.RecordHeader) []byte {
	out := make([]storedHeader, len(hs))
	for i, h := range hs {
		out[i] = storedHeader{h.Key, h.Value}
	}
	b, _ := json.Marshal(out) // strings and bytes always marshal
	return b
}

func decodeHeaders(b []byte) ([]kgo.RecordHeader, error) {
	var hs []storedHeader
	if err := json.Unmarshal(b, &hs); err != nil {
		return nil, err
	}
	out := make([]kgo.RecordHeader, len(hs))
	for i, h := range hs {
		out[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return out, nil
}

// quarantineShadows moves the consumer's unapplied shadows older than
// after to the quarantine, and drops the entries applied since.
func (w *Worker) quarantineShadows(ctx context.Context, tx pgx.Tx, consumer string, after time.Duration) error {
	if w.cfg.unsafeNoMigrationQuarantine {
		return nil
	}
	if _, err := w.queries.InboxQuarantineResolved(ctx, tx, consumer); err != nil {
		return err
	}
	var within time.Duration // past the inbox's retention, an applied event's row may be gone
	if w.cfg.Prune != nil {
		within = w.cfg.Prune.InboxRetention
	}
	n, err := w.queries.InboxQuarantineShadows(ctx, tx, dbsqlc.InboxQuarantineShadowsParams{
		Consumer: consumer, AfterSeconds: after.Seconds(), WithinSeconds: within.Seconds()})
	if err != nil {
		return err
	}
	if n > 0 {
		w.cfg.Logger.Error("live migration: events whose authoritative copy was never applied are quarantined; "+
			"replay them with `worker migration quarantine replay`", "consumer", consumer, "events", n)
	}
	return nil
}

// ListMigrationQuarantined returns the quarantined events of consumer (""
// for every consumer), oldest first.
func ListMigrationQuarantined(ctx context.Context, db outbox.DBTX, consumer string) ([]MigrationQuarantined, error) {
	var c pgtype.Text
	if consumer != "" {
		c = pgtype.Text{String: consumer, Valid: true}
	}
	rows, err := dbsqlc.New().InboxQuarantineList(ctx, db, c)
	if err != nil {
		return nil, fmt.Errorf("inbox: list ferry_inbox_quarantine: %w", err)
	}
	out := make([]MigrationQuarantined, len(rows))
	for i, r := range rows {
		hs, err := decodeHeaders(r.RecordHeaders)
		if err != nil {
			return nil, fmt.Errorf("inbox: ferry_inbox_quarantine %s/%s: headers: %w", r.Consumer, r.MessageID, err)
		}
		out[i] = MigrationQuarantined{Consumer: r.Consumer, ID: r.MessageID, Plan: r.Plan, Side: migration.Side(r.Side),
			Topic: r.Topic, Partition: r.Partition, Offset: r.RecordOffset, Key: r.RecordKey, Value: r.RecordValue,
			Headers: hs, Reason: r.Reason, Received: r.ReceivedAt, At: r.QuarantinedAt}
	}
	return out, nil
}

// ErrNoLongerQuarantined is a replay of an event that left the quarantine
// meanwhile: replayed already, or applied since (for instance by the
// replay of another consumer's quarantine, which publishes the same record
// to a topic both consumers read).
var ErrNoLongerQuarantined = errors.New("it was no longer quarantined (replayed already, or applied meanwhile)")

// ReplayMigrationQuarantined publishes a quarantined event again to the
// topic and partition its shadow came from, without the route stamp (so
// a consumer applies it as it comes) and with its id (so a consumer that
// applied it meanwhile skips it), then deletes it from the quarantine once
// Kafka acknowledged it: it is applied exactly once. kafkaOpts reach the
// channel it came from.
//
// An event no longer in the quarantine is not published, and the error is
// ErrNoLongerQuarantined. One that leaves it while its record is on its
// way was replayed all the same: a worker that applied the record (this
// one, or an earlier replay's) drops the entry itself, so the delete that
// finds nothing then is no failure.
func ReplayMigrationQuarantined(ctx context.Context, db outbox.DBTX, kafkaOpts []kgo.Opt, q MigrationQuarantined) error {
	headers := make([]kgo.RecordHeader, 0, len(q.Headers)+1)
	for _, h := range q.Headers {
		if h.Key != migration.HeaderRoute && h.Key != HeaderRedrivenFrom {
			headers = append(headers, h)
		}
	}
	from := fmt.Sprintf("ferry_inbox_quarantine/%s/%s", q.Consumer, q.ID)
	headers = append(headers, kgo.RecordHeader{Key: HeaderRedrivenFrom, Value: []byte(from)})
	key := dbsqlc.InboxQuarantineHoldsParams{Consumer: q.Consumer, MessageID: q.ID}
	switch held, err := dbsqlc.New().InboxQuarantineHolds(ctx, db, key); {
	case err != nil:
		return fmt.Errorf("inbox: replay %s: %w", from, err)
	case !held:
		return fmt.Errorf("inbox: replay %s: not published: %w", from, ErrNoLongerQuarantined)
	}
	cl, err := kgo.NewClient(append(slices.Clone(kafkaOpts), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		return fmt.Errorf("inbox: replay %s: kafka client: %w", from, err)
	}
	defer cl.Close()
	rec := &kgo.Record{Topic: q.Topic, Partition: q.Partition, Key: q.Key, Value: q.Value, Headers: headers}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("inbox: replay %s to %s/%d: %w", from, q.Topic, q.Partition, err)
	}
	if _, err := dbsqlc.New().InboxQuarantineDelete(ctx, db, dbsqlc.InboxQuarantineDeleteParams(key)); err != nil {
		return fmt.Errorf("inbox: replay %s: published, but not deleted from the quarantine (replaying it again is harmless): %w", from, err)
	}
	return nil
}
