package relaycli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/migration/bridge"
	"github.com/ferryhq/ferry/outbox"
)

// bridgeFlags name the flag of each bridge.Config field, for the errors of
// its validation (see cli.ConfigError).
var bridgeFlags = map[string]string{
	"Config.Plan":               "plan",
	"Config.Topics":             "topics",
	"Config.TopicRegex":         "topic-regex",
	"Config.TopicMap":           "topic-map",
	"Config.TopicTemplate":      "copy-topic-template",
	"Config.Group":              "group",
	"Config.IDHeader":           "id-header",
	"Config.IDFrom":             "id-from",
	"Config.OffsetReset":        "offset-reset",
	"Config.StepInterval":       "step-interval",
	"Config.CommitInterval":     "commit-interval",
	"Config.MaxInFlightRecords": "max-in-flight",
	"Config.ShutdownTimeout":    "shutdown-timeout",
	"Config.TopicCheckInterval": "topic-check-interval",
}

// BridgeHTTPAddrDefault is where `relay bridge` serves /metrics, /healthz
// and /readyz unless told otherwise: beside the relay's (:9187) and the
// worker's (:9188) on one host.
const BridgeHTTPAddrDefault = ":9189"

// runBridge is `relay bridge`: it copies the records of producers that are
// not Ferry's from a migration plan's old channel to its new one, until
// SIGTERM. The clusters and their credentials come from the plan.
func runBridge(ctx context.Context, args []string, _, stderr io.Writer) error {
	f := cli.NewFlags("relay bridge", stderr)
	var base cli.Base
	base.Register(f)
	plan := f.String("plan", "", "the migration plan whose old channel is copied to its new one (required)")
	topics := f.String("topics", "", "the old channel's topics to copy, comma-separated (or --topic-regex); on a RabbitMQ old channel, its exchanges")
	regex := f.String("topic-regex", "", "also copy every topic of the old cluster whose whole name matches this regular expression (Kafka only)")
	tmap := topicMap{m: map[string]string{}}
	f.Var(&tmap, "topic-map", "old=new: copy topic old to topic new; repeatable, or comma-separated")
	template := f.String("copy-topic-template", bridge.TopicTemplateDefault, "the new topic of each old topic --topic-map does not name; {topic} is the old name")
	group := f.String("group", "", "the bridge's consumer group on the old cluster, or the consumer of its queues on RabbitMQ (default "+bridge.GroupPrefix+"<plan>)")
	idHeader := f.String("id-header", outbox.HeaderID, "the header that holds a record's id on the old channel; copies carry it as "+outbox.HeaderID)
	idFrom := f.String("id-from", string(bridge.IDFromDefault), "header: the id header, else an id derived from key and value; payload: always derived from key and value")
	reset := f.String("offset-reset", string(bridge.OffsetResetDefault), "where a partition the group never committed starts: earliest or latest")
	step := f.PositiveDuration("step-interval", bridge.StepIntervalDefault, "how often the plan's current step is read")
	commit := f.PositiveDuration("commit-interval", bridge.CommitIntervalDefault, "how often offsets the new cluster acknowledged are committed")
	maxInFlight := f.Count("max-in-flight", bridge.MaxInFlightRecordsDefault, "copies sent and not yet acknowledged, at most")
	shutdown := f.PositiveDuration("shutdown-timeout", bridge.ShutdownTimeoutDefault, "how long stopping, or giving up partitions, waits for the new cluster's acknowledgements")
	topicCheck := f.PositiveDuration("topic-check-interval", bridge.TopicCheckIntervalDefault,
		"how often the bridge checks that each of --topics exists on the old cluster, and says which do not")
	clientID := f.String("kafka-client-id", "ferry-bridge", "Kafka client id on both clusters")
	var http cli.HTTP
	http.Register(f, BridgeHTTPAddrDefault)
	tmap.fromEnv = len(tmap.m) > 0
	logger, err := base.Parse(f, args, stderr)
	if err != nil {
		return err
	}
	pool, err := base.DB.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	kafkaLog := func(side migration.Side) kgo.Opt {
		return kgo.WithLogger(kslog.New(logger.With(slog.String("component", "kafka"), slog.String("side", string(side)))))
	}
	cfg := bridge.Config{
		Plan:               *plan,
		DB:                 pool,
		Topics:             commaItems(*topics),
		TopicRegex:         *regex,
		TopicMap:           tmap.m,
		TopicTemplate:      *template,
		Group:              *group,
		IDHeader:           *idHeader,
		IDFrom:             bridge.IDFrom(*idFrom),
		OffsetReset:        bridge.OffsetReset(*reset),
		StepInterval:       *step,
		CommitInterval:     *commit,
		MaxInFlightRecords: *maxInFlight,
		ShutdownTimeout:    *shutdown,
		TopicCheckInterval: *topicCheck,
		OldKafkaOpts:       []kgo.Opt{kgo.ClientID(*clientID), kafkaLog(migration.OldSide)},
		NewKafkaOpts:       []kgo.Opt{kgo.ClientID(*clientID), kafkaLog(migration.NewSide)},
		Logger:             logger,
	}
	b, err := bridge.New(&cfg)
	if err != nil {
		return cli.ConfigError(err, bridgeFlags)
	}
	// /readyz says what keeps the bridge from copying: a topic of --topics
	// the old cluster does not have, the plan not read yet.
	stopHTTP, err := http.Serve(cli.NewRegistry(), cli.Probes{Ready: b.Ready, Hide: base.DB.Names()}, logger)
	if err != nil {
		return err
	}
	defer stopHTTP()
	cfg = cfg.WithDefaults()
	logger.Info("bridge starting", slog.String("database", base.DB.Redacted()), slog.String("plan", cfg.Plan),
		slog.String("group", cfg.Group), slog.Any("topics", cfg.Topics), slog.String("topic_regex", cfg.TopicRegex))
	err = b.Run(ctx)
	st := b.Stats()
	logger.Info("bridge stopped", slog.Int64("copied", st.Published), slog.Int64("derived_ids", st.DerivedIDs),
		slog.Int64("commits", st.Commits))
	if errors.Is(err, migration.ErrNotFound) || errors.Is(err, bridge.ErrTopicLoop) {
		return cli.ConfigError(err, bridgeFlags)
	}
	return err
}

// topicMap is --topic-map: old=new, repeatable or comma-separated. The
// command line replaces what the environment (FERRY_TOPIC_MAP) gave, as
// every other flag does.
type topicMap struct {
	m       map[string]string
	fromEnv bool // m came from the environment; the first flag clears it
}

func (t *topicMap) String() string {
	if t == nil {
		return ""
	}
	pairs := make([]string, 0, len(t.m))
	for from, to := range t.m {
		pairs = append(pairs, from+"="+to)
	}
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}

// Set adds old=new pairs.
func (t *topicMap) Set(s string) error {
	if t.fromEnv {
		t.m, t.fromEnv = map[string]string{}, false
	}
	for _, pair := range commaItems(s) {
		from, to, ok := strings.Cut(pair, "=")
		from, to = strings.TrimSpace(from), strings.TrimSpace(to)
		if !ok || from == "" || to == "" {
			return fmt.Errorf("%q: want old=new", pair)
		}
		if prev, dup := t.m[from]; dup && prev != to {
			return fmt.Errorf("topic %s is mapped to both %s and %s", from, prev, to)
		}
		t.m[from] = to
	}
	return nil
}

// commaItems splits a comma-separated list, dropping empty items.
func commaItems(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
