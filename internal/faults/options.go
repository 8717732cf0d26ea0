package faults

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// Options configure a run of the suite.
type Options struct {
	// Events is how many events the load generator commits, at least.
	Events int
	// LoadDuration spreads the events; faults are injected while they are
	// written, and one full round of every fault kind is injected even if
	// the load finishes first.
	LoadDuration time.Duration
	// Aggregates, Clients and MaxTx shape the load (see LoadOptions).
	Aggregates, Clients, MaxTx int
	// PoisonEvery and HugeEvery add a poison (dead-letter) or an oversized
	// (quarantine) event to every n-th transaction of a load client.
	PoisonEvery, HugeEvery int
	// Broker is the channel the run goes through: BrokerKafka (the
	// default) or BrokerRabbitMQ.
	Broker string
	// MigrateTo is the kind of a migration run's new channel (RunMigration):
	// BrokerKafka (the default: the stack's cluster B) or BrokerRabbitMQ
	// (the stack's node, with Shards shards). Broker is the old channel's.
	MigrateTo string
	// StepGap is the pause after each request of a migration run's script;
	// 0 spreads the script over LoadDuration.
	StepGap time.Duration
	// Foreign is how many aggregates a producer that is not Ferry's writes
	// on a migration run's RabbitMQ old channel, bridged to the new one by
	// `relay bridge`; 0: none.
	Foreign int
	// Partitions of the run's topic. On RabbitMQ, the shard count when
	// Shards is 0.
	Partitions int
	// Shards is the RabbitMQ shard count (--rabbitmq-shards), a power of
	// two; 0 means Partitions.
	Shards int
	// FailEvery makes the checker handler fail the first attempt of about
	// one message in FailEvery with a transient error (the requeue
	// control); 0: never.
	FailEvery int
	// TopicMaxMessageBytes is the topic's max.message.bytes; oversized
	// events are 1.5 times as large.
	TopicMaxMessageBytes int
	// Workers is how many checker worker processes run; each hosts every
	// consumer. Consumers is how many consumers (groups) there are.
	Workers, Consumers int
	// WorkerArgs are extra `worker run` flags for worker i (batch size, key
	// concurrency): the workers of a group need not be configured alike.
	WorkerArgs func(i int) []string
	// SessionTimeout is the workers' group session timeout
	// (--kafka-session-timeout): how long a killed or paused worker keeps its
	// partitions. A paused worker stays paused 5-10 s longer than this.
	SessionTimeout time.Duration
	// KafkaOutage bounds the broker stop, drawn in [min, max].
	KafkaOutage [2]time.Duration
	// FaultGap bounds the pause between two faults, drawn in [min, max].
	FaultGap [2]time.Duration
	// Rounds is how many times every kind is injected, each round in a new
	// random order; 0 repeats rounds for as long as the load runs (at least
	// one).
	Rounds int
	// Warmup is how long the load runs before the first fault.
	Warmup time.Duration
	// DrainTimeout bounds the wait for the pipeline to drain after the load
	// and the faults ended.
	DrainTimeout time.Duration
	// Kinds are the fault kinds to inject. Defaults to all.
	Kinds []FaultKind
	// EffectDelay is slept in each effect (the worker's negative control).
	EffectDelay time.Duration
	// Seed makes the fault schedule and the load's transactions
	// reproducible; 0 picks one from the clock.
	Seed uint64
	// Bins are the programs to run. Required.
	Bins Binaries
	// WorkDir receives a directory of logs per run. Required.
	WorkDir string
	// Keep keeps the run's database and topics even when the run passes.
	Keep bool
	// Log receives progress lines. Defaults to discarding them.
	Log io.Writer
}

// Short is the run `make test` does: about a minute and a half, 24,000
// events over 60 s, every fault kind once.
func Short() Options {
	return Options{
		Events:               24_000,
		LoadDuration:         60 * time.Second,
		Aggregates:           1000,
		Clients:              4,
		MaxTx:                300,
		PoisonEvery:          150,
		HugeEvery:            250,
		Partitions:           8,
		TopicMaxMessageBytes: 128 << 10,
		Workers:              2,
		Consumers:            2,
		WorkerArgs:           defaultWorkerArgs,
		SessionTimeout:       10 * time.Second,
		KafkaOutage:          [2]time.Duration{10 * time.Second, 20 * time.Second},
		FaultGap:             [2]time.Duration{2 * time.Second, 5 * time.Second},
		Rounds:               1,
		Warmup:               5 * time.Second,
		DrainTimeout:         4 * time.Minute,
	}
}

// The brokers a run can go through (Options.Broker).
const (
	BrokerKafka    = "kafka"
	BrokerRabbitMQ = "rabbitmq"
)

func (o *Options) rabbit() bool { return o.Broker == BrokerRabbitMQ }

// shards is the RabbitMQ shard count of the run.
func (o *Options) shards() int {
	if o.Shards > 0 {
		return o.Shards
	}
	return o.Partitions
}

// RabbitMQShort is the RabbitMQ run `make test` does: Short's shape over
// RabbitMQ, RabbitMQFaults once each, shorter broker outages and gaps, so
// that the run stays near two minutes (the freeze alone must outlast the
// clients' 30 s heartbeat timeout).
func RabbitMQShort() Options {
	o := Short()
	o.Broker = BrokerRabbitMQ
	// The load lasts as long as the faults do (about 100 s, the broker's
	// restarts and the freeze being long), so that each one hits a
	// pipeline under load; half Short's events: the workers apply what
	// the broker's outages held back at some 500 events a second on two
	// cores, and 18,000 events drained in 45 s after the load.
	o.Events, o.LoadDuration = 12_000, 95*time.Second
	o.PoisonEvery, o.HugeEvery = 100, 160
	o.Kinds = RabbitMQFaults
	// The node takes some 15 s to start again after a stop or a kill,
	// which adds to the outage drawn here.
	o.KafkaOutage = [2]time.Duration{2 * time.Second, 5 * time.Second}
	o.FaultGap = [2]time.Duration{time.Second, 2 * time.Second}
	return o
}

// Soak is `make soak`: a million events over about twenty minutes, the
// fault kinds in rounds for as long as the load runs.
func Soak() Options {
	o := Short()
	o.Events = 1_000_000
	o.LoadDuration = 20 * time.Minute
	o.FaultGap = [2]time.Duration{5 * time.Second, 20 * time.Second}
	o.Rounds = 0
	o.PoisonEvery = 4000
	o.HugeEvery = 6000
	o.DrainTimeout = 20 * time.Minute
	return o
}

// defaultWorkerArgs configures the two workers of a group differently: one
// applies batches of messages, the other one message per transaction with
// several keys of a partition at once.
func defaultWorkerArgs(i int) []string {
	if i%2 == 0 {
		return []string{"--batch-size", "50"}
	}
	return []string{"--batch-size", "1", "--key-concurrency", "4"}
}

func (o *Options) validate() error {
	switch {
	case o.Bins.Relay == "" || o.Bins.Faults == "":
		return errors.New("faults: Options.Bins are required (BuildBinaries)")
	case o.WorkDir == "":
		return errors.New("faults: Options.WorkDir is required")
	case o.Events <= 0 || o.LoadDuration <= 0:
		return errors.New("faults: Events and LoadDuration must be positive")
	case o.Workers < 1 || o.Consumers < 1:
		return errors.New("faults: Workers and Consumers must be at least 1")
	case o.Aggregates < 1 || o.Aggregates > 10000:
		return errors.New("faults: Aggregates must be between 1 and 10000")
	case o.Broker != "" && o.Broker != BrokerKafka && o.Broker != BrokerRabbitMQ:
		return fmt.Errorf("faults: Broker %q: want %s or %s", o.Broker, BrokerKafka, BrokerRabbitMQ)
	case o.MigrateTo != "" && o.MigrateTo != BrokerKafka && o.MigrateTo != BrokerRabbitMQ:
		return fmt.Errorf("faults: MigrateTo %q: want %s or %s", o.MigrateTo, BrokerKafka, BrokerRabbitMQ)
	case (o.rabbit() || o.MigrateTo == BrokerRabbitMQ) && rabbitmq.CheckShards(o.shards()) != nil:
		return fmt.Errorf("faults: RabbitMQ shards %d: %w", o.shards(), rabbitmq.CheckShards(o.shards()))
	case o.Foreign < 0 || o.Foreign > 0 && !o.rabbit():
		return fmt.Errorf("faults: Foreign %d: a foreign producer writes to a RabbitMQ old channel only", o.Foreign)
	}
	if o.rabbit() {
		for _, k := range o.Kinds {
			// Cluster B is a migration's new channel.
			if !slices.Contains(RabbitMQFaults, k) && k != FaultKafkaBStop {
				return fmt.Errorf("faults: fault %s does not apply to a RabbitMQ run (RabbitMQFaults are %v)", k, RabbitMQFaults)
			}
		}
	}
	return nil
}
