package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/outbox"
)

// EventForeignNoted is what the migration demo's foreign producer, a
// service that is not Ferry's, publishes to reserva's orders exchange on
// RabbitMQ. Reserva's stock worker consumes that exchange and leaves every
// event but OrderPlaced alone, so a note changes nothing but the inbox,
// which records once when the worker took it: enough to count each note
// applied once and to check each aggregate's order, across the move.
const EventForeignNoted = "ForeignNoted"

// foreignAggregates is how many aggregates (foreign-00, ...) the foreign
// producer writes to, in turn: at 16 a second, a note a second on each.
const foreignAggregates = 16

// idCarrier is how a foreign message carries its id: in the message id,
// in the id header, or not at all (the workers and the bridge derive the
// same id from exchange, routing key and body).
type idCarrier int

const (
	carrierMessageID idCarrier = iota
	carrierHeader
	carrierNone
	carriers
)

func (c idCarrier) String() string {
	return [...]string{"message id", "id header", "no id"}[c]
}

// foreignNote is a ForeignNoted payload: its aggregate and its number
// there, from 1. Every body differs, so that derived ids do too.
type foreignNote struct {
	Aggregate string `json:"aggregate"`
	Seq       int    `json:"seq"`
}

// foreignSent is a message the foreign producer published, once the
// broker confirmed it.
type foreignSent struct {
	id, aggregate string
	seq           int
	carrier       idCarrier
	confirmed     time.Time
}

// foreignMessage is the i-th message (from 0) of the foreign producer on
// exchange: the aggregates in turn, the id carriers in turn, routed to the
// shard of its aggregate id as Ferry's relay routes it.
func foreignMessage(i int, exchange string, shards int) (foreignSent, string, amqp.Publishing) {
	s := foreignSent{aggregate: fmt.Sprintf("foreign-%02d", i%foreignAggregates), seq: i/foreignAggregates + 1,
		carrier: idCarrier(i % int(carriers))}
	key := rabbitmq.RoutingKey(rabbitmq.Shard([]byte(s.aggregate), shards))
	body, _ := json.Marshal(foreignNote{Aggregate: s.aggregate, Seq: s.seq}) // a string and an int always marshal
	p := amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body,
		Headers: amqp.Table{outbox.HeaderAggregateID: s.aggregate, outbox.HeaderEventType: EventForeignNoted}}
	switch s.carrier {
	case carrierMessageID:
		s.id = uuid.NewString()
		p.MessageId = s.id
	case carrierHeader:
		s.id = uuid.NewString()
		p.Headers[outbox.HeaderID] = s.id
	case carrierNone:
		s.id = rabbitmq.DerivedID(&amqp.Delivery{Exchange: exchange, RoutingKey: key, Body: body})
	}
	return s, key, p
}

// foreignProducer publishes notes to an exchange of the old RabbitMQ
// channel at a steady pace, each confirmed before the next, so that each
// aggregate's order is the order it publishes in (a confirm that is slow
// to come holds the next message: pace says how far behind rate it fell).
type foreignProducer struct {
	conn     rabbitmq.Conn
	exchange string
	shards   int
	rate     int
	pace     pace

	mu   sync.Mutex
	sent []foreignSent
}

// published returns the messages confirmed so far.
func (f *foreignProducer) published() []foreignSent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]foreignSent(nil), f.sent...)
}

// run publishes until ctx ends, and returns ctx's error then. The message
// being published when it ends is finished first: one the broker took
// unconfirmed would be applied without being counted. A message whose
// confirm does not come is published again, on a new connection, with the
// same id and body: the inbox applies it once.
func (f *foreignProducer) run(ctx context.Context) error {
	var conn *amqp.Connection
	var ch *amqp.Channel
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	interval := time.Second / time.Duration(f.rate)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	f.pace.begin(time.Now(), interval)
	publishCtx := context.WithoutCancel(ctx)
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		s, key, p := foreignMessage(i, f.exchange, f.shards)
		const attempts = 5
		for attempt := 1; ; attempt++ {
			if ch == nil {
				var err error
				if conn, ch, err = f.dial(); err != nil {
					return fmt.Errorf("foreign producer: %w", err)
				}
			}
			err := f.publish(publishCtx, ch, key, p)
			if err == nil {
				break
			}
			_ = conn.Close()
			conn, ch = nil, nil
			if attempt == attempts {
				return fmt.Errorf("foreign producer: %s to %s, %d attempts: %w", s.aggregate, f.exchange, attempts, err)
			}
		}
		s.confirmed = time.Now()
		f.pace.send(i, s.confirmed)
		f.mu.Lock()
		f.sent = append(f.sent, s)
		f.mu.Unlock()
	}
}

func (f *foreignProducer) dial() (*amqp.Connection, *amqp.Channel, error) {
	conn, err := f.conn.Dial(rabbitNames)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

// publish publishes p and waits up to ten seconds for its confirm. Not
// mandatory: the workers' queues exist before the producer starts, and a
// message lost anyway is missing in the checks.
func (f *foreignProducer) publish(ctx context.Context, ch *amqp.Channel, key string, p amqp.Publishing) error {
	dc, err := ch.PublishWithDeferredConfirm(f.exchange, key, false, false, p)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ok, err := dc.WaitContext(wctx)
	if err == nil && !ok {
		err = errors.New("nacked by the broker")
	}
	return err
}
