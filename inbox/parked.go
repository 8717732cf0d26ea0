package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/outbox"
)

// Parked is a message a worker could neither apply nor dead-letter, kept in
// inbox_parked: the handler gave up on it and Kafka refuses its dead letter
// for good (too large: a dead letter carries more headers than the
// original). Its partition moved on; nothing of it is lost.
type Parked struct {
	Consumer  string
	Topic     string
	Partition int32
	Offset    int64
	ID        string // the message id, "" when it had none

	// The original record.
	Key       []byte
	Value     []byte
	Headers   []kgo.RecordHeader
	Timestamp time.Time

	Reason          DeadLetterReason // why it was dead-lettered
	Error           string           // the handler's or decoder's error
	Attempts        int
	DeadLetterError string // why Kafka refused the dead letter
	ParkedAt        time.Time
}

func parkedFrom(r *dbsqlc.InboxParked) Parked {
	p := Parked{
		Consumer: r.Consumer, Topic: r.Topic, Partition: r.KafkaPartition, Offset: r.KafkaOffset, ID: r.MessageID,
		Key: r.RecordKey, Value: r.RecordValue, Timestamp: r.RecordTimestamp,
		Reason: DeadLetterReason(r.Reason), Error: r.Error, Attempts: int(r.Attempts), DeadLetterError: r.DeadLetterError, ParkedAt: r.ParkedAt,
	}
	for i, k := range r.HeaderKeys {
		p.Headers = append(p.Headers, kgo.RecordHeader{Key: k, Value: r.HeaderValues[i]})
	}
	return p
}

// ListParked returns up to limit parked messages of consumer ("" for every
// consumer), oldest first.
func ListParked(ctx context.Context, db outbox.DBTX, consumer string, limit int) ([]Parked, error) {
	rows, err := dbsqlc.New().InboxParkedList(ctx, db, dbsqlc.InboxParkedListParams{Consumer: consumer, MaxRows: int32(min(limit, 1<<30))})
	if err != nil {
		return nil, fmt.Errorf("inbox: list inbox_parked: %w", err)
	}
	out := make([]Parked, len(rows))
	for i, r := range rows {
		out[i] = parkedFrom(r)
	}
	return out, nil
}

// RedriveParked republishes a parked message to its original topic and
// partition, with its original key, value and headers (so the same id: an
// inbox that applied it once skips it) plus HeaderRedrivenFrom, and deletes
// it from inbox_parked once Kafka acknowledged it. It came from that topic,
// so it fits there. Fix what failed first (the handler's bug): a message
// that fails again is dead-lettered or parked again.
func RedriveParked(ctx context.Context, db outbox.DBTX, kafkaOpts []kgo.Opt, p Parked) error {
	headers := make([]kgo.RecordHeader, 0, len(p.Headers)+1)
	size := len(p.Key) + len(p.Value)
	for _, h := range p.Headers {
		if h.Key != HeaderRedrivenFrom {
			headers = append(headers, h)
			size += len(h.Key) + len(h.Value)
		}
	}
	from := fmt.Sprintf("inbox_parked/%s/%s/%d/%d", p.Consumer, p.Topic, p.Partition, p.Offset)
	headers = append(headers, kgo.RecordHeader{Key: HeaderRedrivenFrom, Value: []byte(from)})
	// The original partition, as for a dead letter; and room for a record
	// as large as the topic took.
	opts := append(slices.Clone(kafkaOpts), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if size+64<<10 > 1_000_012 {
		opts = append(opts, kgo.ProducerBatchMaxBytes(int32(size+64<<10)))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("inbox: redrive parked: kafka client: %w", err)
	}
	defer cl.Close()
	rec := &kgo.Record{Topic: p.Topic, Partition: p.Partition, Key: p.Key, Value: p.Value, Headers: headers, Timestamp: p.Timestamp}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("inbox: redrive %s: %w", from, err)
	}
	n, err := dbsqlc.New().InboxParkedDelete(ctx, db, dbsqlc.InboxParkedDeleteParams{
		Consumer: p.Consumer, Topic: p.Topic, KafkaPartition: p.Partition, KafkaOffset: p.Offset})
	switch {
	case err != nil:
		// Republished but still listed: redriving it again is harmless.
		return fmt.Errorf("inbox: redrive %s: republished, but not deleted from inbox_parked: %w", from, err)
	case n == 0:
		return errors.New("inbox: redrive " + from + ": republished; it was no longer in inbox_parked (redriven twice?)")
	}
	return nil
}
