package bridge

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/internal/topicname"
	"github.com/ferryhq/ferry/outbox"
)

// Defaults of Config.
const (
	GroupPrefix               = "ferry-bridge-" // the group is GroupPrefix + the plan's name
	TopicTemplateDefault      = TopicPlaceholder
	IDFromDefault             = IDFromHeader
	OffsetResetDefault        = OffsetResetEarliest
	StepIntervalDefault       = time.Second
	CommitIntervalDefault     = time.Second
	MaxInFlightRecordsDefault = 10_000
	ShutdownTimeoutDefault    = 30 * time.Second
	TopicCheckIntervalDefault = 30 * time.Second
)

// TopicPlaceholder is replaced by the old topic's name in
// Config.TopicTemplate.
const TopicPlaceholder = "{topic}"

// IDFrom says where a copy's id comes from (Config.IDFrom).
type IDFrom string

// Values of Config.IDFrom.
const (
	// IDFromHeader takes the id from the record's Config.IDHeader header,
	// and derives it from the payload when the record has none: a SHA-256
	// of key and value, the id inbox.Config.IDFromPayloadHash derives.
	IDFromHeader IDFrom = "header"
	// IDFromPayload always derives the id from the payload, whatever the
	// record's headers say.
	IDFromPayload IDFrom = "payload"
)

// OffsetReset is where a partition the bridge's group has never committed
// starts (Config.OffsetReset).
type OffsetReset string

// Values of Config.OffsetReset.
const (
	// OffsetResetEarliest copies the partition's whole retained log: a
	// bridge started late misses nothing.
	OffsetResetEarliest OffsetReset = "earliest"
	// OffsetResetLatest copies what is written from now on.
	OffsetResetLatest OffsetReset = "latest"
)

// Config configures a Bridge. Plan, DB and Topics or TopicRegex are
// required.
type Config struct {
	// Plan names the migration (see migration.Controller): its old channel
	// is read, its new channel written, and its current step stamps every
	// copy. Required.
	Plan string

	// DB holds the plan (the producer's PostgreSQL), read every
	// StepInterval. Required.
	DB outbox.Beginner

	// Topics are the old channel's topics to copy. Topics or TopicRegex
	// is required.
	Topics []string

	// TopicRegex copies every topic of the old cluster it matches (besides
	// Topics), including those created while the bridge runs. Topic
	// names are matched whole ("^" and "$" are implied).
	TopicRegex string

	// TopicMap renames topics: old name -> new name. Each old name must be
	// one the bridge copies. Defaults to none.
	TopicMap map[string]string

	// TopicTemplate names the new topic of every old topic TopicMap does
	// not rename: TopicPlaceholder is the old name ("legacy.{topic}").
	// Defaults to TopicPlaceholder: the same name.
	TopicTemplate string

	// Group is the bridge's consumer group on the old cluster, its own:
	// its committed offsets are how far the copy is safely done. Defaults
	// to GroupPrefix + Plan.
	Group string

	// IDHeader names the header that holds a record's id on the old
	// channel. Each copy carries its id in the outbox.HeaderID header,
	// once. Defaults to outbox.HeaderID.
	IDHeader string

	// IDFrom is IDFromHeader or IDFromPayload. Defaults to IDFromHeader.
	IDFrom IDFrom

	// OffsetReset is where a partition the group has never committed
	// starts: OffsetResetEarliest or OffsetResetLatest. A committed offset
	// that retention has deleted resumes at the earliest offset either
	// way: copying again is safe, skipping is not. Defaults to
	// OffsetResetEarliest.
	OffsetReset OffsetReset

	// StepInterval is how often the plan's current step is read. Defaults
	// to one second.
	StepInterval time.Duration

	// CommitInterval is how often acknowledged offsets are committed.
	// Defaults to one second.
	CommitInterval time.Duration

	// MaxInFlightRecords bounds the records sent to the new cluster and not
	// yet acknowledged; at the bound the bridge stops reading. Defaults to
	// 10,000.
	MaxInFlightRecords int

	// ShutdownTimeout is how long stopping, and giving up partitions in a
	// rebalance, waits for the new cluster's acknowledgements before the
	// offsets are committed; what is not acknowledged by then is copied
	// again later. Keep it below the group's rebalance timeout (franz-go:
	// one minute). Defaults to 30 seconds.
	ShutdownTimeout time.Duration

	// TopicCheckInterval is how often the bridge checks that each topic
	// of Topics exists on the old cluster. A consumer group waits in
	// silence for a topic that does not exist, so the bridge says which
	// do not, at every check until they do, and Ready fails meanwhile.
	// Defaults to 30 seconds.
	TopicCheckInterval time.Duration

	// OldKafkaOpts and NewKafkaOpts are added to the options that reach
	// the plan's channels (migration.Channel.KafkaOpts): a client id, a
	// logger (kslog), a larger kgo.ProducerBatchMaxBytes for records above
	// franz-go's default of 1,000,012 bytes. Defaults to none.
	OldKafkaOpts []kgo.Opt
	NewKafkaOpts []kgo.Opt

	// Getenv reads the environment variables the plan's channels name for
	// their SASL passwords. Defaults to os.Getenv.
	Getenv func(string) string

	// Logger receives the bridge's logs. Defaults to a logger that
	// discards.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.TopicTemplate = cmp.Or(c.TopicTemplate, TopicTemplateDefault)
	if c.Plan != "" {
		c.Group = cmp.Or(c.Group, GroupPrefix+c.Plan)
	}
	c.IDHeader = cmp.Or(c.IDHeader, outbox.HeaderID)
	c.IDFrom = cmp.Or(c.IDFrom, IDFromDefault)
	c.OffsetReset = cmp.Or(c.OffsetReset, OffsetResetDefault)
	c.StepInterval = cmp.Or(c.StepInterval, StepIntervalDefault)
	c.CommitInterval = cmp.Or(c.CommitInterval, CommitIntervalDefault)
	c.MaxInFlightRecords = cmp.Or(c.MaxInFlightRecords, MaxInFlightRecordsDefault)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, ShutdownTimeoutDefault)
	c.TopicCheckInterval = cmp.Or(c.TopicCheckInterval, TopicCheckIntervalDefault)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func checkTopic(field, name string) error {
	if !topicname.Valid(name) {
		return fmt.Errorf("bridge: %s: %q is not a Kafka topic name (1 to 249 of a-z, A-Z, 0-9, '.', '_', '-')", field, name)
	}
	return nil
}

// validate names the first wrong field.
func (c Config) validate() error {
	if c.Plan == "" {
		return errors.New("bridge: Config.Plan is required: the name of the migration plan")
	}
	if c.DB == nil {
		return errors.New("bridge: Config.DB is required: the database that holds the plan")
	}
	if len(c.Topics) == 0 && c.TopicRegex == "" {
		return errors.New("bridge: Config.Topics is required (or Config.TopicRegex): the old channel's topics to copy")
	}
	for _, t := range c.Topics {
		if err := checkTopic("Config.Topics", t); err != nil {
			return err
		}
	}
	re, err := c.regex()
	if err != nil {
		return fmt.Errorf("bridge: Config.TopicRegex %q: %w", c.TopicRegex, err)
	}
	for from, to := range c.TopicMap {
		if err := checkTopic("Config.TopicMap", from); err != nil {
			return err
		}
		if err := checkTopic("Config.TopicMap", to); err != nil {
			return err
		}
		if !slices.Contains(c.Topics, from) && (re == nil || !re.MatchString(from)) {
			return fmt.Errorf("bridge: Config.TopicMap renames %q, which the bridge does not copy (not in Config.Topics, not matched by Config.TopicRegex)", from)
		}
	}
	if !strings.Contains(c.TopicTemplate, TopicPlaceholder) {
		return fmt.Errorf("bridge: Config.TopicTemplate %q: want %s in it, or every topic would be copied onto one", c.TopicTemplate, TopicPlaceholder)
	}
	if err := checkTopic("Config.TopicTemplate", strings.ReplaceAll(c.TopicTemplate, TopicPlaceholder, "t")); err != nil {
		return err
	}
	for _, t := range c.Topics {
		if err := checkTopic("Config.TopicTemplate", newTopic(c.TopicMap, c.TopicTemplate, t)); err != nil {
			return err
		}
	}
	if c.Group == "" || strings.ContainsAny(c.Group, " \t\n,") {
		return fmt.Errorf("bridge: Config.Group %q: want a consumer group name without spaces or commas", c.Group)
	}
	switch {
	case c.IDHeader == "" || c.IDHeader == route.HeaderRoute:
		return fmt.Errorf("bridge: Config.IDHeader %q: want the name of the header that holds the id", c.IDHeader)
	case c.IDFrom != IDFromHeader && c.IDFrom != IDFromPayload:
		return fmt.Errorf("bridge: Config.IDFrom %q: want %s or %s", c.IDFrom, IDFromHeader, IDFromPayload)
	case c.IDFrom == IDFromPayload && c.IDHeader != outbox.HeaderID:
		return fmt.Errorf("bridge: Config.IDFrom %s ignores every header, so Config.IDHeader %q means nothing: set one or the other", c.IDFrom, c.IDHeader)
	case c.OffsetReset != OffsetResetEarliest && c.OffsetReset != OffsetResetLatest:
		return fmt.Errorf("bridge: Config.OffsetReset %q: want %s or %s", c.OffsetReset, OffsetResetEarliest, OffsetResetLatest)
	case c.StepInterval <= 0:
		return fmt.Errorf("bridge: Config.StepInterval is %s: must be positive", c.StepInterval)
	case c.CommitInterval <= 0:
		return fmt.Errorf("bridge: Config.CommitInterval is %s: must be positive", c.CommitInterval)
	case c.MaxInFlightRecords < 1 || c.MaxInFlightRecords > 1_000_000:
		return fmt.Errorf("bridge: Config.MaxInFlightRecords is %d: must be within [1, 1000000]", c.MaxInFlightRecords)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("bridge: Config.ShutdownTimeout is %s: must be positive", c.ShutdownTimeout)
	case c.TopicCheckInterval <= 0:
		return fmt.Errorf("bridge: Config.TopicCheckInterval is %s: must be positive", c.TopicCheckInterval)
	}
	return nil
}

// regex compiles TopicRegex, anchored; nil when there is none.
func (c Config) regex() (*regexp.Regexp, error) {
	if c.TopicRegex == "" {
		return nil, nil
	}
	return regexp.Compile("^(?:" + c.TopicRegex + ")$")
}

// newTopic is the new channel's topic of an old one.
func newTopic(m map[string]string, template, old string) string {
	if to, ok := m[old]; ok {
		return to
	}
	return strings.ReplaceAll(template, TopicPlaceholder, old)
}
