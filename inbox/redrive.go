package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/outbox"
)

// DeadLetter is one record of a dead-letter topic, decoded.
type DeadLetter struct {
	// Topic, Partition and Offset locate the dead letter itself.
	Topic     string
	Partition int32
	Offset    int64

	ID       string // the message id (id header), "" when it had none
	Reason   DeadLetterReason
	Error    string
	Attempts int
	Consumer string
	FailedAt time.Time

	// Where the message was consumed from.
	OriginalTopic     string
	OriginalPartition int32
	OriginalOffset    int64
	OriginalTimestamp time.Time
	// OriginalQueue is, on RabbitMQ, the shard queue the message came from
	// (Ferry's ferry.dlq.original_queue, or the broker's x-death queue);
	// redrive publishes to it.
	OriginalQueue string

	// The original record: key, value and headers without the dead-letter
	// headers.
	Key     []byte
	Value   []byte
	Headers []kgo.RecordHeader
}

// DeadLetterFilter selects dead letters. Every set field must match; the
// zero filter matches all.
type DeadLetterFilter struct {
	IDs      []string  // message ids
	Consumer string    // the consumer that gave up
	Since    time.Time // failed at or after
	Until    time.Time // failed before
}

func (f *DeadLetterFilter) match(d *DeadLetter) bool {
	if f == nil {
		return true
	}
	switch {
	case len(f.IDs) > 0 && !slices.Contains(f.IDs, d.ID):
		return false
	case f.Consumer != "" && f.Consumer != d.Consumer:
		return false
	case !f.Since.IsZero() && d.FailedAt.Before(f.Since):
		return false
	case !f.Until.IsZero() && !d.FailedAt.Before(f.Until):
		return false
	}
	return true
}

// ParseDeadLetter decodes a record of a dead-letter topic. It fails when
// the record lacks the origin headers a redrive needs.
func ParseDeadLetter(r *kgo.Record) (*DeadLetter, error) {
	d := &DeadLetter{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value}
	var have struct{ topic, partition bool }
	var errs []error
	for _, h := range r.Headers {
		v := string(h.Value)
		switch h.Key {
		case outbox.HeaderID:
			if d.ID == "" {
				d.ID = v
			}
		case HeaderDeadLetterReason:
			d.Reason = DeadLetterReason(v)
		case HeaderDeadLetterError:
			d.Error = v
		case HeaderDeadLetterAttempts:
			d.Attempts, _ = strconv.Atoi(v)
		case HeaderDeadLetterConsumer:
			d.Consumer = v
		case HeaderDeadLetterFailedAt:
			d.FailedAt, _ = time.Parse(time.RFC3339Nano, v)
		case HeaderDeadLetterOriginalTopic:
			d.OriginalTopic, have.topic = v, v != ""
		case HeaderDeadLetterOriginalPartition:
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil {
				errs = append(errs, fmt.Errorf("header %s: %w", h.Key, err))
			}
			d.OriginalPartition, have.partition = int32(n), err == nil
		case HeaderDeadLetterOriginalOffset:
			d.OriginalOffset, _ = strconv.ParseInt(v, 10, 64)
		case HeaderDeadLetterOriginalTimestamp:
			d.OriginalTimestamp, _ = time.Parse(time.RFC3339Nano, v)
		}
		if !strings.HasPrefix(h.Key, deadLetterHeaderPrefix) {
			d.Headers = append(d.Headers, h)
		}
	}
	if !have.topic || !have.partition {
		errs = append(errs, fmt.Errorf("dead letter %s/%d/%d has no %s and %s headers", r.Topic, r.Partition, r.Offset,
			HeaderDeadLetterOriginalTopic, HeaderDeadLetterOriginalPartition))
	}
	return d, errors.Join(errs...)
}

// ListDeadLetters reads the dead-letter topic from its start to its end as
// it is when called, and returns the dead letters that match filter (which
// may be nil), oldest first per partition. kafkaOpts reach the cluster
// (seed brokers, TLS, SASL).
func ListDeadLetters(ctx context.Context, kafkaOpts []kgo.Opt, topic string, filter *DeadLetterFilter) ([]DeadLetter, error) {
	var out []DeadLetter
	err := scanTopic(ctx, kafkaOpts, topic, func(r *kgo.Record) {
		d, _ := ParseDeadLetter(r)
		if filter.match(d) {
			out = append(out, *d)
		}
	})
	return out, err
}

// ErrNoDeadLetter means a redrive found nothing to republish for what it
// was asked: an id without a dead letter it may republish in the topic, a
// filter that matched none, or dead letters that were all skipped.
// Nothing was republished.
var ErrNoDeadLetter = errors.New("no dead letter to redrive")

// RedriveResult says what Redrive did.
type RedriveResult struct {
	Redriven []DeadLetter // republished, in order
	// Skipped matched but were not republished: they lack the origin
	// headers, or name an original topic the dead-letter topic does not
	// belong to (see Redrive). SkipReasons says why, by position.
	Skipped     []DeadLetter
	SkipReasons []string
}

// redriveTarget checks that d may go back to its original topic: a
// dead-letter topic is its topic's name plus a suffix that starts with '.',
// '-' or '_', so a dead letter in it can only have come from that topic. One naming another topic was not
// written by a worker of this topic (Kafka ACLs should let only workers
// write to dead-letter topics), and republishing it there would forge an
// event into a topic its writer could not write to.
func redriveTarget(d *DeadLetter) error {
	if !strings.HasPrefix(d.Topic, d.OriginalTopic) || len(d.Topic) == len(d.OriginalTopic) ||
		!strings.ContainsRune(".-_", rune(d.Topic[len(d.OriginalTopic)])) {
		return fmt.Errorf("dead letter %s/%d/%d names original topic %q, but dead-letter topic %s belongs to another topic: not redriven",
			d.Topic, d.Partition, d.Offset, d.OriginalTopic, d.Topic)
	}
	if d.Reason == "" {
		return fmt.Errorf("dead letter %s/%d/%d has no %s header: not written by a Ferry worker, not redriven", d.Topic, d.Partition, d.Offset, HeaderDeadLetterReason)
	}
	return nil
}

// Redrive republishes the dead letters that match filter (nil: all) to
// their original topic and partition with their original key, value and
// headers, so that the id header is the same and the inbox keeps the
// effect single however often a message is redriven. It republishes only
// to the topic the dead-letter topic belongs to (topic minus its suffix)
// and only records with Ferry's dead-letter headers; others are skipped
// with their reason. Each redriven record
// also carries HeaderRedrivenFrom. It returns after Kafka acknowledged every
// record. Redrive does not delete dead letters (Kafka cannot): select them
// by id or time.
//
// A redrive that finds nothing to republish for what it was asked fails
// with ErrNoDeadLetter and republishes nothing: an id of filter.IDs
// without a dead letter it may republish (none in the topic, or only
// skipped ones), a filter that matches no dead letter, or dead letters
// that are all skipped. A nil or zero filter on a topic that holds no
// dead letter finds nothing and asked for nothing in particular: no error.
func Redrive(ctx context.Context, kafkaOpts []kgo.Opt, topic string, filter *DeadLetterFilter) (*RedriveResult, error) {
	res := &RedriveResult{}
	var recs []*kgo.Record
	err := scanTopic(ctx, kafkaOpts, topic, func(r *kgo.Record) {
		d, perr := ParseDeadLetter(r)
		if !filter.match(d) {
			return
		}
		if perr == nil {
			perr = redriveTarget(d)
		}
		if perr != nil {
			res.Skipped = append(res.Skipped, *d)
			res.SkipReasons = append(res.SkipReasons, perr.Error())
			return
		}
		headers := make([]kgo.RecordHeader, 0, len(d.Headers)+1)
		for _, h := range d.Headers {
			if h.Key != HeaderRedrivenFrom {
				headers = append(headers, h)
			}
		}
		headers = append(headers, kgo.RecordHeader{Key: HeaderRedrivenFrom, Value: fmt.Appendf(nil, "%s/%d/%d", d.Topic, d.Partition, d.Offset)})
		recs = append(recs, &kgo.Record{Topic: d.OriginalTopic, Partition: d.OriginalPartition, Key: d.Key, Value: d.Value, Headers: headers})
		res.Redriven = append(res.Redriven, *d)
	})
	if err != nil {
		return res, err
	}
	if err := res.nothingFound(filter); err != nil {
		res.Redriven = nil
		return res, fmt.Errorf("inbox: redrive from %s: %w", topic, err)
	}
	if len(recs) == 0 {
		return res, nil
	}
	// The original partition, not a hash of the key: the relay may route
	// with a partitioner of its own, and the record must land where the
	// later events of its key are.
	cl, err := kgo.NewClient(append(slices.Clone(kafkaOpts), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		return &RedriveResult{Skipped: res.Skipped, SkipReasons: res.SkipReasons}, fmt.Errorf("inbox: redrive: kafka client: %w", err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		// Some may have been written; redriving them again is harmless.
		return &RedriveResult{Skipped: res.Skipped, SkipReasons: res.SkipReasons}, fmt.Errorf("inbox: redrive from %s: %w", topic, err)
	}
	return res, nil
}

// nothingFound says what of filter the redrive found nothing to republish
// for, wrapping ErrNoDeadLetter; nil when it found something for all of it.
func (res *RedriveResult) nothingFound(filter *DeadLetterFilter) error {
	var missing []string
	if filter != nil {
		for _, id := range slices.Compact(slices.Sorted(slices.Values(filter.IDs))) {
			if slices.ContainsFunc(res.Redriven, func(d DeadLetter) bool { return d.ID == id }) {
				continue
			}
			if slices.ContainsFunc(res.Skipped, func(d DeadLetter) bool { return d.ID == id }) {
				missing = append(missing, strconv.Quote(id)+" (skipped)")
			} else {
				missing = append(missing, strconv.Quote(id))
			}
		}
	}
	zero := filter == nil || (len(filter.IDs) == 0 && filter.Consumer == "" && filter.Since.IsZero() && filter.Until.IsZero())
	switch {
	case len(missing) > 0:
		return fmt.Errorf("%w with id %s; nothing was republished", ErrNoDeadLetter, strings.Join(missing, ", "))
	case len(res.Redriven) > 0:
		return nil
	case len(res.Skipped) > 0:
		return fmt.Errorf("%w: the %d dead letters that match were all skipped", ErrNoDeadLetter, len(res.Skipped))
	case !zero:
		return fmt.Errorf("%w: no dead letter matches the selection", ErrNoDeadLetter)
	}
	return nil
}

// scanTopic calls fn for every record of topic between its start and the
// end offsets listed when it begins.
func scanTopic(ctx context.Context, kafkaOpts []kgo.Opt, topic string, fn func(*kgo.Record)) error {
	cl, err := kgo.NewClient(kafkaOpts...)
	if err != nil {
		return fmt.Errorf("inbox: kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("inbox: end offsets of %s: %w", topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("inbox: start offsets of %s: %w", topic, err)
	}
	want := make(map[int32]int64)
	from := make(map[int32]kgo.Offset)
	ends.Each(func(o kadm.ListedOffset) {
		start := starts[o.Topic][o.Partition].Offset
		if o.Offset > start {
			want[o.Partition] = o.Offset
			from[o.Partition] = kgo.NewOffset().At(start)
		}
	})
	if len(want) == 0 {
		return nil
	}
	reader, err := kgo.NewClient(append(slices.Clone(kafkaOpts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		return fmt.Errorf("inbox: kafka client: %w", err)
	}
	defer reader.Close()
	for len(want) > 0 {
		fetches := reader.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("inbox: read %s: %w", topic, err)
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) { ferr = errors.Join(ferr, err) })
		if ferr != nil {
			return fmt.Errorf("inbox: read %s: %w", topic, ferr)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			end, ok := want[r.Partition]
			if !ok || r.Offset >= end {
				return
			}
			fn(r)
			if r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
	return nil
}
