package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// ReasonUnknownTopic is the quarantine reason of an event whose topic did
// not exist for Config.UnknownTopicWait (and the broker did not create it).
const ReasonUnknownTopic QuarantineReason = "unknown_topic"

// ReasonUnroutable is the quarantine reason of an event RabbitMQ returned
// as unroutable (the exchange exists, no queue is bound for its routing
// key) for Config.UnknownTopicWait: no consumer's shard queue would have
// received it.
const ReasonUnroutable QuarantineReason = "unroutable"

// errUnknownTopic marks a record quarantined because its topic stayed
// missing for Config.UnknownTopicWait.
var errUnknownTopic = errors.New("topic does not exist")

// refusal classes of topicGate.
const (
	refusedUnknownTopic = "unknown topic"
	refusedUnroutable   = "unroutable"
	refusedNoConsumer   = "consumer queues missing"
	refusedAuthz        = "not authorized"
)

// refusalOf says whether Kafka's error is one the session waits out in
// place, topic by topic, instead of failing the session (which would
// publish everything past the confirmed position again, over and over):
// a topic that does not exist (yet), or a credential or ACL that refuses.
// On RabbitMQ, a missing exchange is an unknown topic, a message no queue
// is bound for is unroutable (held alike, quarantined with its own
// reason), a refused write is not authorized, and an exchange that lacks a
// required consumer's queue (RabbitMQConfig.Consumers) is held for as long
// as it lasts, like a refused write.
func refusalOf(err error) (string, bool) {
	switch {
	case errors.Is(err, rabbitmq.ErrExchangeMissing):
		return refusedUnknownTopic, true
	case errors.Is(err, rabbitmq.ErrUnroutable):
		return refusedUnroutable, true
	case errors.Is(err, rabbitmq.ErrAccessRefused):
		return refusedAuthz, true
	case errors.Is(err, rabbitmq.ErrConsumerQueuesMissing):
		return refusedNoConsumer, true
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		return refusedUnknownTopic, true
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed),
		errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		return refusedAuthz, true
	}
	return "", false
}

// topicGate holds back, in order, the records of topics Kafka refuses for
// now, and waits each refusal out in place: the session and the other
// topics keep flowing, nothing is confirmed past a held record (it is still
// in flight), and no record of a held topic overtakes an older one. A
// goroutine per held topic sends its oldest record alone, with backoff;
// once Kafka takes it, the rest follow in order. A topic that stays
// unknown for Config.UnknownTopicWait has its records quarantined; an
// authorization failure is waited out for as long as it lasts, with the
// relay not ready (Relay.Ready says why).
type topicGate struct {
	s    *session
	sink Sink // where the gate's channel is written
	mu   sync.Mutex
	held map[string]*heldTopic
}

type heldTopic struct {
	class     string
	since     time.Time
	err       error
	queue     []*inflight // by seq
	probe     *inflight   // the oldest record, out alone to see whether Kafka takes it now
	releasing bool        // the probe was taken: the queue is on its way, in order
}

func newTopicGate(s *session, sink Sink) *topicGate {
	return &topicGate{s: s, sink: sink, held: map[string]*heldTopic{}}
}

// admit reports whether p may go to Kafka now; if its topic is held, p
// joins the queue instead.
func (g *topicGate) admit(p *inflight) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	h, ok := g.held[p.rec.Topic]
	if !ok {
		return true
	}
	h.enqueue(p)
	return false
}

// refuse holds p, whose record Kafka refused for a reason of class, and
// starts waiting the refusal out unless its topic is held already.
func (g *topicGate) refuse(p *inflight, class string, err error) {
	g.mu.Lock()
	h, ok := g.held[p.rec.Topic]
	start := !ok || h.releasing
	if !ok {
		h = &heldTopic{class: class, since: time.Now()}
		g.held[p.rec.Topic] = h
		g.s.r.metrics.heldTopics.Inc()
	}
	h.class, h.err = class, err
	h.releasing = false // a release in progress stops; the wait starts over
	if h.probe == p {
		h.probe = nil
	}
	h.enqueue(p)
	g.mu.Unlock()
	if start {
		g.s.log.Warn(g.s.r.brokerLower()+" refuses a topic for now: holding its records and retrying in place; nothing is confirmed past them",
			slog.String("topic", p.rec.Topic), slog.String("refusal", class), slog.String("error", err.Error()))
		go g.wait(p.rec.Topic)
	}
}

func (h *heldTopic) enqueue(p *inflight) {
	i := sort.Search(len(h.queue), func(i int) bool { return h.queue[i].seq > p.seq })
	h.queue = slices.Insert(h.queue, i, p)
}

// wait probes a held topic with its oldest record, with backoff, until
// Kafka takes it (accepted then releases the rest) or an unknown topic
// outlived Config.UnknownTopicWait (its records go to quarantine).
func (g *topicGate) wait(topic string) {
	retry := backoff.Sequence{Base: 250 * time.Millisecond, Ceiling: 5 * time.Second}
	for {
		select {
		case <-g.s.sctx.Done():
			return
		case <-time.After(retry.Next()):
		}
		g.mu.Lock()
		h, ok := g.held[topic]
		switch {
		case !ok || h.releasing:
			g.mu.Unlock()
			return
		case h.probe != nil:
			g.mu.Unlock()
			continue // still out
		case (h.class == refusedUnknownTopic || h.class == refusedUnroutable) && time.Since(h.since) >= g.s.cfg.UnknownTopicWait:
			delete(g.held, topic)
			g.mu.Unlock()
			g.s.r.metrics.heldTopics.Dec()
			reason, err := g.giveUp(topic, h)
			for _, p := range h.queue {
				g.s.quarantine(quarantined{p: p, reason: reason, err: err})
			}
			return
		}
		p := h.queue[0]
		h.queue = h.queue[1:]
		h.probe = p
		p.probing.Store(true)
		g.mu.Unlock()
		g.sink.Produce(g.s.sctx, &p.rec, g.s.promise)
	}
}

// giveUp is the quarantine reason and error of the records of a topic held
// as unknown or unroutable for Config.UnknownTopicWait.
func (g *topicGate) giveUp(topic string, h *heldTopic) (QuarantineReason, error) {
	wait := g.s.cfg.UnknownTopicWait
	switch {
	case h.class == refusedUnroutable:
		return ReasonUnroutable, fmt.Errorf("%w: exchange %q had no queue bound for the events' routing keys for %s "+
			"(declare the consumers' shard queues with `worker schema`; then `relay quarantine requeue`): %w", errUnknownTopic, topic, wait, h.err)
	case errors.Is(h.err, rabbitmq.ErrExchangeMissing):
		return ReasonUnknownTopic, fmt.Errorf("%w: exchange %q stayed missing for %s "+
			"(declare it with `worker schema`; then `relay quarantine requeue`): %w", errUnknownTopic, topic, wait, h.err)
	}
	return ReasonUnknownTopic, fmt.Errorf("%w: topic %q stayed unknown for %s (create it, or let the broker create it: "+
		"auto.create.topics.enable plus --kafka-auto-create-topics; then `relay quarantine requeue`): %w",
		errUnknownTopic, topic, wait, h.err)
}

// accepted tells the gate Kafka took p. If p was its topic's probe, the
// topic's held records go to Kafka in order, then the topic is released;
// a record published meanwhile joins the queue's end.
func (g *topicGate) accepted(p *inflight) {
	if !p.probing.Load() { // every record but a probe: no lock taken
		return
	}
	p.probing.Store(false)
	g.mu.Lock()
	h, ok := g.held[p.rec.Topic]
	if !ok || h.probe != p {
		g.mu.Unlock()
		return
	}
	h.probe, h.releasing = nil, true
	g.mu.Unlock()
	// Not from franz-go's promise goroutine: Produce can block.
	go g.release(p.rec.Topic, h)
}

// release sends h's queue in order, without holding the lock while
// producing, until it is empty (the topic is then released) or a record is
// refused again (the wait starts over).
func (g *topicGate) release(topic string, h *heldTopic) {
	n := 0
	for {
		g.mu.Lock()
		if g.held[topic] != h || !h.releasing {
			g.mu.Unlock()
			return
		}
		if len(h.queue) == 0 {
			delete(g.held, topic)
			g.mu.Unlock()
			g.s.r.metrics.heldTopics.Dec()
			g.s.log.Info(g.s.r.brokerLower()+" takes the topic again: its held records are on their way",
				slog.String("topic", topic), slog.Int("records", n+1), slog.Duration("held_for", time.Since(h.since)))
			return
		}
		p := h.queue[0]
		h.queue = h.queue[1:]
		g.mu.Unlock()
		g.sink.Produce(g.s.sctx, &p.rec, g.s.promise)
		n++
	}
}

// reason explains, for the readiness probe, which topics are held and why;
// "" when none is.
func (g *topicGate) reason() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.held) == 0 {
		return ""
	}
	var parts []string
	for topic, h := range g.held {
		parts = append(parts, fmt.Sprintf("topic %s %s since %s: %v", topic, h.class, h.since.UTC().Format(time.RFC3339), h.err))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}
