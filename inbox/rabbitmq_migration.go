package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
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
// first time, and waits for the broker's confirms.
func (s *rabbitSource) publishReports(ctx context.Context, reports []migration.Report) error {
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
