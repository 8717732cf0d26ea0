package migration

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/internal/topicname"
)

// queuesBeforeCopies says why DUAL_WRITE towards a RabbitMQ new channel
// must wait: a group of the plan lacks a shard queue, on the new broker,
// of an exchange that will take the copies of a topic it consumes on the
// old channel (a queue receives only what is published after it exists,
// and the broker does not say when another group's queue took a copy). ""
// when every queue is there, or the new channel is Kafka.
//
// On a Kafka old channel the topics are those the groups committed
// offsets on. A RabbitMQ old channel cannot list them: the relay's own
// check (it holds an exchange's copies until every group's queues exist)
// is then the only one, and it holds the relay, not the request.
func queuesBeforeCopies(ctx context.Context, p Plan, getenv func(string) string) string {
	if p.New.KindOf() != RabbitMQ || p.Old.KindOf() != Kafka {
		return ""
	}
	if getenv == nil {
		getenv = os.Getenv
	}
	topics, err := consumedTopics(ctx, p, getenv)
	if err != nil {
		return "cannot read the topics the groups consume on the old channel, to check their queues on the new one: " + err.Error()
	}
	if len(topics) == 0 {
		return ""
	}
	pc := p.New.rabbitPlan("new")
	conn, err := pc.Conn(getenv)
	if err != nil {
		return "cannot check the groups' queues on the new channel: " + err.Error()
	}
	amqpConn, err := conn.Dial(pc.Names())
	if err != nil {
		return "cannot check the groups' queues on the new channel: " + err.Error()
	}
	defer amqpConn.Close()
	for _, g := range p.Groups {
		missing, err := rabbitmq.Missing(amqpConn, &rabbitmq.Topology{Consumer: g, Topics: topics, Shards: p.New.Shards})
		if err != nil {
			return "cannot check the groups' queues on the new channel: " + err.Error()
		}
		if len(missing) > 0 {
			return fmt.Sprintf("group %s has %d of its %d shard queues missing on the new channel (e.g. %s): declare them "+
				"(`worker schema` with the new channel's settings) before copies flow, or they pass it by",
				g, len(missing), len(topics)*p.New.Shards, missing[0])
		}
	}
	return ""
}

// consumedTopics are the new channel's names of the topics the plan's
// groups committed offsets on in the old Kafka channel.
func consumedTopics(ctx context.Context, p Plan, getenv func(string) string) ([]string, error) {
	opts, err := p.Old.KafkaOpts("old", getenv)
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	old, err := committedTopics(ctx, kadm.NewClient(cl), p, p.Groups)
	if err != nil {
		return nil, err
	}
	pattern, newPattern := topicname.NewPattern(p.Old.TopicTemplate), topicname.NewPattern(p.New.TopicTemplate)
	var out []string
	for _, t := range old {
		agg, evt, ok := pattern.Parse(t)
		if !ok || (newPattern.Uses(topicname.AggregateType) && !pattern.Uses(topicname.AggregateType)) ||
			(newPattern.Uses(topicname.EventType) && !pattern.Uses(topicname.EventType)) {
			continue // not an event topic of the old template, or one whose peer the new template cannot name
		}
		out = append(out, topicname.Fill(p.New.TopicTemplate, agg, evt))
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
