package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/outbox"
)

// defaultMaxMessageBytes is Kafka's default max.message.bytes, the limit the
// writer's default payload limit is derived from: it applies until a topic's
// own limit is known, and when it cannot be read. (franz-go's own default,
// 1,000,012 bytes, would quarantine every event above about 977 KiB.)
const defaultMaxMessageBytes = outbox.KafkaMaxMessageBytesDefault

// franzBatchPrefix is what franz-go counts in a batch beyond what Kafka
// checks against max.message.bytes: the 4-byte length of the records in the
// produce request. The client's batch limit is the topic's limit plus it, so
// the client refuses exactly the records the broker would.
const franzBatchPrefix = 4

// franz-go's bounds for a batch limit.
const (
	minBatchBytes = 512
	maxBatchBytes = 1 << 30
)

// errBatchTooLarge is a transient error: the broker refused a batch as too
// large and this record, small enough on its own, was in it.
var errBatchTooLarge = errors.New("the broker refused a batch as too large")

// kafkaSink is the relay's own Sink: a franz-go client that learns each
// topic's max.message.bytes before producing to it and builds batches up to
// it, never above. An oversized record then fails alone, before it is
// batched with others, and only it is quarantined. Should the broker still
// refuse a batch (the limit changed), the records in it fail with
// errBatchTooLarge, the session restarts, and the client is rebuilt with
// fresh limits.
//
// Produce never waits for Kafka: the replication loop calls it, and that
// loop must send PostgreSQL a status update within the server timeout
// whatever the brokers do. A record of a topic whose limit is not known, or
// past its time, waits in the topic's queue while a goroutine asks the
// broker, and goes out, in order, once it answered.
type kafkaSink struct {
	opts   []kgo.Opt
	log    *slog.Logger
	ttl    time.Duration // how long a learnt limit is trusted
	limits sync.Map      // topic -> *topicLimit

	mu      sync.Mutex
	cl      *kgo.Client
	rebuild atomic.Bool

	// learnMu guards learning: the topics whose limit is being read, with
	// their records. Records are handed to the client under it when they
	// leave a queue, so that none is sent after AbortBufferedRecords
	// drained the queues.
	learnMu  sync.Mutex
	learning map[string]*learningTopic

	strikesMu sync.Mutex
	strikes   map[string]bool // record ids refused once in a batch too large
	struck    atomic.Int64    // len(strikes), read without strikesMu
}

// learningTopic holds, in order, the records of a topic whose limit is
// being read.
type learningTopic struct{ queue []queuedRecord }

// failLearning answers every record waiting in learning with err and
// empties it, under mu (a sink's learnMu); the promises run after it is
// released.
func failLearning(mu *sync.Mutex, learning map[string]*learningTopic, err error) {
	mu.Lock()
	var queued []queuedRecord
	for topic, l := range learning {
		queued = append(queued, l.queue...)
		delete(learning, topic)
	}
	mu.Unlock()
	for _, q := range queued {
		q.promise(q.rec, err)
	}
}

type queuedRecord struct {
	ctx     context.Context
	rec     *kgo.Record
	promise func(*kgo.Record, error)
}

// topicLimit is a topic's max.message.bytes as learnt. Once ttl passed it
// is stale: the next record of the topic reads it again, and until then it
// is still the best known, the one the client's batches and tooLargeAlone
// go by (not Kafka's default, which a topic's smaller limit would make the
// broker refuse whole batches under).
type topicLimit struct {
	bytes int32
	stale atomic.Bool
}

func newKafkaSink(opts []kgo.Opt, ttl time.Duration, log *slog.Logger) (*kafkaSink, error) {
	s := &kafkaSink{opts: opts, ttl: ttl, log: log, strikes: map[string]bool{},
		learning: map[string]*learningTopic{}}
	cl, err := s.newClient()
	if err != nil {
		return nil, err
	}
	s.cl = cl
	return s, nil
}

func (s *kafkaSink) newClient() (*kgo.Client, error) {
	return kgo.NewClient(append(append([]kgo.Opt{}, s.opts...), kgo.ProducerBatchMaxBytesFn(s.limit))...)
}

// limit is the client's batch limit for a topic.
func (s *kafkaSink) limit(topic string) int32 {
	return s.maxMessageBytes(topic) + franzBatchPrefix
}

// maxMessageBytes is a topic's max.message.bytes as last learnt, stale or
// not.
func (s *kafkaSink) maxMessageBytes(topic string) int32 {
	if v, ok := s.limits.Load(topic); ok {
		return v.(*topicLimit).bytes
	}
	return defaultMaxMessageBytes
}

func (s *kafkaSink) client() *kgo.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cl
}

// learn reads a topic's max.message.bytes. A topic that does not exist yet
// (the broker may create it) or a broker that does not answer leaves the
// default. The client's batches keep the limit it had when it first produced
// to the topic; should the limit change, the strikes in Produce rebuild it.
// It reports false when the broker says the topic does not exist; nothing
// is remembered then, so the next record asks again.
func (s *kafkaSink) learn(ctx context.Context, cl *kgo.Client, topic string) (exists bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	limit := int32(defaultMaxMessageBytes)
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, topic)
	if err == nil && len(rcs) == 1 && (errors.Is(rcs[0].Err, kerr.UnknownTopicOrPartition) || errors.Is(rcs[0].Err, kerr.UnknownTopicID)) {
		return false
	}
	if err == nil && len(rcs) == 1 && rcs[0].Err == nil {
		for _, c := range rcs[0].Configs {
			if c.Key == "max.message.bytes" && c.Value != nil {
				if n, err := strconv.ParseInt(*c.Value, 10, 32); err == nil {
					limit = int32(min(max(n, minBatchBytes), maxBatchBytes-franzBatchPrefix))
				}
			}
		}
	}
	// Past ttl the limit is stale and the next record learns it again: a
	// timer rather than a clock read per record.
	l := &topicLimit{bytes: limit}
	s.limits.Store(topic, l)
	time.AfterFunc(s.ttl, func() { l.stale.Store(true) })
	return true
}

// Produce implements Sink. It never waits for Kafka (see kafkaSink).
func (s *kafkaSink) Produce(ctx context.Context, rec *kgo.Record, promise func(*kgo.Record, error)) {
	if faultDrop != nil && faultDrop(rec, s.log) {
		promise(rec, nil)
		return
	}
	s.learnMu.Lock()
	if l, ok := s.learning[rec.Topic]; ok {
		l.queue = append(l.queue, queuedRecord{ctx, rec, promise})
		s.learnMu.Unlock()
		return
	}
	if v, ok := s.limits.Load(rec.Topic); !ok || v.(*topicLimit).stale.Load() {
		l := &learningTopic{queue: []queuedRecord{{ctx, rec, promise}}}
		s.learning[rec.Topic] = l
		s.learnMu.Unlock()
		go s.learnThenSend(ctx, rec.Topic, l)
		return
	}
	s.learnMu.Unlock()
	s.produce(ctx, rec, promise)
}

// learnThenSend reads the limit of topic, then sends l's records in order,
// those queued meanwhile included, and lets the topic's next records go
// straight to the client.
func (s *kafkaSink) learnThenSend(ctx context.Context, topic string, l *learningTopic) {
	cl := s.client()
	exists := s.learn(ctx, cl, topic) || s.autoCreate(cl)
	s.learnMu.Lock()
	if s.learning[topic] != l {
		s.learnMu.Unlock()
		return // aborted: AbortBufferedRecords answered the records
	}
	delete(s.learning, topic)
	if exists {
		for _, q := range l.queue { // before any later record of the topic
			s.produce(q.ctx, q.rec, q.promise)
		}
	}
	s.learnMu.Unlock()
	if !exists {
		// Refused at once, rather than after franz-go's own retries of an
		// unknown topic (tens of seconds): the session holds them.
		for _, q := range l.queue {
			q.promise(q.rec, fmt.Errorf("topic %s: %w", q.rec.Topic, kerr.UnknownTopicOrPartition))
		}
	}
}

// produce hands rec to the client.
func (s *kafkaSink) produce(ctx context.Context, rec *kgo.Record, promise func(*kgo.Record, error)) {
	s.client().Produce(ctx, rec, func(r *kgo.Record, err error) {
		if err != nil && errors.Is(err, kerr.MessageTooLarge) && !s.tooLargeAlone(r) {
			err = fmt.Errorf("%w: %w", errBatchTooLarge, err)
			s.rebuild.Store(true)
		} else if err == nil && s.struck.Load() != 0 {
			s.forgive(r)
		}
		if faultHoldAck != nil && faultHoldAck(r, err, promise) {
			return
		}
		promise(r, err)
	})
}

// faultHoldAck is nil except in relays built with the ferryfault tag (the
// fault suite's, see ackhold_ferryfault.go): it may keep an
// acknowledgement back, and then returns true and answers promise later.
var faultHoldAck func(r *kgo.Record, err error, promise func(*kgo.Record, error)) bool

// faultDrop is nil except in relays built with the ferryfault tag and
// given a lossy new channel (lossy_ferryfault.go): a record it returns
// true for is acknowledged without being written.
var faultDrop func(r *kgo.Record, log *slog.Logger) bool

// autoCreate reports whether the client asks the broker to create missing
// topics (kgo.AllowAutoTopicCreation).
func (s *kafkaSink) autoCreate(cl *kgo.Client) bool {
	v, _ := cl.OptValue(kgo.AllowAutoTopicCreation).(bool)
	return v
}

// tooLargeAlone decides whether a record refused as too large is the
// culprit: its own bytes exceed the topic's limit, or the broker refused it
// a second time, after a rebuild put it in a batch of its own. A record
// judged so forgets its strike: requeued later, it is judged afresh.
func (s *kafkaSink) tooLargeAlone(r *kgo.Record) bool {
	id := recordID(r)
	s.strikesMu.Lock()
	defer s.strikesMu.Unlock()
	if userSize(r) > int(s.maxMessageBytes(r.Topic)) || s.strikes[id] {
		if s.strikes[id] {
			delete(s.strikes, id)
			s.struck.Add(-1)
		}
		return true
	}
	s.strikes[id] = true
	s.struck.Add(1)
	return false
}

// forgive forgets the strike of a record the broker took.
func (s *kafkaSink) forgive(r *kgo.Record) {
	id := recordID(r)
	s.strikesMu.Lock()
	defer s.strikesMu.Unlock()
	if s.strikes[id] {
		delete(s.strikes, id)
		s.struck.Add(-1)
	}
}

// recordID is the outbox id a record carries in its id header.
func recordID(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == outbox.HeaderID {
			return string(h.Value)
		}
	}
	return ""
}

func userSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// AbortBufferedRecords implements Sink. When the abort is cut short (ctx
// ends while a produce request is still unanswered), franz-go documents that
// the client may be left invalid, and the aborted records stay buffered and
// retried: the sink then closes the client, which fails every one of them,
// and puts a new one in its place. It does so too after a batch was refused
// as too large. A new client learns the topics' limits again. The error is
// the abort's, and nil once the client is replaced.
func (s *kafkaSink) AbortBufferedRecords(ctx context.Context) error {
	failLearning(&s.learnMu, s.learning, kgo.ErrAborting)

	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.cl.AbortBufferedRecords(ctx)
	tooLarge := s.rebuild.Swap(false)
	if err == nil && !tooLarge {
		return nil
	}
	cl, nerr := s.newClient()
	if nerr != nil {
		s.rebuild.Store(true) // try again after the next session
		return errors.Join(err, nerr)
	}
	s.cl.Close()
	s.cl = cl
	s.limits.Clear()
	if err != nil {
		s.log.Warn("the abort of buffered records was cut short; replaced the Kafka client", slog.String("error", err.Error()))
	} else {
		s.log.Info("replaced the Kafka client after a batch was refused as too large")
	}
	return nil
}

// Close closes the client.
func (s *kafkaSink) Close() { s.client().Close() }

// Ping asks a broker for its API versions: an idle relay's proof that Kafka
// answers (see Relay.Ready).
func (s *kafkaSink) Ping(ctx context.Context) error { return s.client().Ping(ctx) }
