package inbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/migration"
)

// A consumer whose own channel is RabbitMQ follows a live migration as a
// Kafka one does, but what it tells the controller goes through RabbitMQ:
// its reports to the report stream (migration.ReportTopic) of its broker,
// and its dead letters are read from its topics' .dlq streams.

// rabbitDeadLetterIdle is how long a report's reading of a dead-letter
// stream waits for one more message before it takes the stream to be read.
const rabbitDeadLetterIdle = 500 * time.Millisecond

// publishReports appends reports to the report stream, declaring it the
// first time, and waits for the broker's confirms. Each carries the
// producers seen since the previous report.
func (s *rabbitSource) publishReports(ctx context.Context, reports []migration.Report) (err error) {
	seen := s.producers.take()
	defer func() {
		if err != nil {
			s.producers.putBack(seen)
		}
	}()
	for i := range reports {
		reports[i].Producers = seen
	}
	conn, err := s.connection()
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if !s.reportsDeclared {
		if err := rabbitmq.DeclareStream(ch, migration.ReportTopic, migration.ReportStreamMaxAge); err != nil {
			return err
		}
		s.reportsDeclared = true
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	confirms := make([]*amqp.DeferredConfirmation, 0, len(reports))
	for _, r := range reports {
		v, _ := json.Marshal(r) // numbers, strings and a time always marshal
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", migration.ReportTopic, true, false, amqp.Publishing{
			MessageId: r.Key(), Timestamp: time.Now(), ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: v})
		if err != nil {
			return fmt.Errorf("publish to %s: %w", migration.ReportTopic, err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("publish to %s: %w", migration.ReportTopic, err)
		}
		if !ok {
			return fmt.Errorf("publish to %s: nacked by the broker", migration.ReportTopic)
		}
	}
	return nil
}

// deadLetters returns the ids the consumer dead-lettered at or after since
// on the .dlq streams of its topics; ok is false when a stream could not
// be read now.
func (s *rabbitSource) deadLetters(ctx context.Context, since time.Time) (ids []string, ok bool) {
	conn, err := dialCtx(ctx, s.cfg, " dlq")
	if err != nil {
		return nil, false
	}
	defer func() { _ = conn.CloseDeadline(time.Now().Add(5 * time.Second)) }()
	filter := &DeadLetterFilter{Consumer: s.g.name, Since: since}
	for _, topic := range s.topicList() {
		stream := topic + rabbitmq.DeadLetterStreamSuffix
		if _, exists, err := rabbitmq.Inspect(conn, stream); err != nil {
			return nil, false
		} else if !exists {
			continue // nothing was ever dead-lettered there
		}
		dls, err := listRabbit(ctx, conn, stream, filter, rabbitDeadLetterIdle)
		if err != nil {
			return nil, false
		}
		for _, d := range dls {
			if d.ID != "" {
				ids = append(ids, d.ID)
			}
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids), true
}

// producerTally counts the deliveries of a RabbitMQ consumer's topics by
// the user id the broker validated (the user the publishing connection
// logged in as; "" for a publisher that set none), between two reports: how
// a migration shows a producer on the old channel that is neither the
// relay nor a bridge.
type producerTally struct {
	mu   sync.Mutex
	seen map[topicUser]*migration.ProducerSeen
}

type topicUser struct{ topic, user string }

// note adds a batch's deliveries of topic, by user.
func (t *producerTally) note(topic string, users map[string]int64, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.seen == nil {
		t.seen = map[topicUser]*migration.ProducerSeen{}
	}
	for user, n := range users {
		k := topicUser{topic, user}
		p := t.seen[k]
		if p == nil {
			p = &migration.ProducerSeen{Topic: topic, User: user}
			t.seen[k] = p
		}
		p.Records += n
		p.Last = at
	}
}

// take returns what was counted since the last take, and starts again.
func (t *producerTally) take() []migration.ProducerSeen {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]migration.ProducerSeen, 0, len(t.seen))
	for _, p := range t.seen {
		out = append(out, *p)
	}
	clear(t.seen)
	slices.SortFunc(out, func(a, b migration.ProducerSeen) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.User, b.User))
	})
	return out
}

// putBack returns what a report could not publish, for the next one.
func (t *producerTally) putBack(ps []migration.ProducerSeen) {
	for _, p := range ps {
		t.note(p.Topic, map[string]int64{p.User: p.Records}, p.Last)
	}
}
