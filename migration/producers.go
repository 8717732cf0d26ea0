package migration

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/route"
)

// ProducersWindowDefault is how far back Producers looks by default.
const ProducersWindowDefault = 24 * time.Hour

// UnknownProducer is the producer id of a record written without
// idempotence (a producer with enable.idempotence=false, or franz-go's
// DisableIdempotentWrite): such records say nothing of who wrote them, so
// any number of producers may hide behind it.
const UnknownProducer int64 = -1

// ProducersOpts are the options of Producers; nil means every default.
type ProducersOpts struct {
	// Topics are the old channel's topics to read. A plan holds a topic
	// template, whose topics cannot be listed, so by default they are the
	// topics in which Groups committed offsets on the old cluster (see
	// Producers for the ones left out).
	Topics []string
	// Groups are the consumer groups whose committed offsets name the
	// topics when Topics is empty. Defaults to the plan's groups.
	Groups []string
	// Window is how far back to look: the records whose timestamp is at
	// most Window old count. Defaults to ProducersWindowDefault.
	Window time.Duration
	// Getenv reads the variable the old channel names for its SASL
	// password. Defaults to os.Getenv.
	Getenv func(string) string
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// ProducersResult is who wrote to the old channel's topics in a window.
type ProducersResult struct {
	// Since and Until bound the window: Until is when the topics' ends
	// were read.
	Since, Until time.Time
	// Groups are the groups whose committed offsets named the topics;
	// empty when ProducersOpts.Topics named them.
	Groups []string
	// Topics are the topics read, by name.
	Topics []TopicProducers
}

// TopicProducers is who wrote to one topic in the window.
type TopicProducers struct {
	Topic string
	// Missing says the topic does not exist (any more) on the old
	// channel: nothing was read.
	Missing bool
	// Records counts the records in the window, control records left out.
	Records int64
	// Producers are the distinct producer ids seen, by id. A producer id is
	// one producer session: a producer that restarted shows once per run,
	// and one that wrote a single record counts as much as a busy one.
	Producers []Producer
	// Unknown sums the records without a producer id (ID UnknownProducer):
	// one non-idempotent producer or several. Records is 0 when none.
	Unknown Producer
}

// Producer is what one producer id wrote to a topic in the window.
type Producer struct {
	ID      int64
	Records int64
	// Stamped counts its records that carry Ferry's route stamp or
	// fence header: a producer with stamped records is a Ferry relay in a
	// phase that writes both channels. The converse does not hold: a relay
	// in OLD_ONLY stamps nothing, and the producer id of no record says
	// which program wrote it.
	Stamped             int64
	FirstSeen, LastSeen time.Time
}

// deadLetterSuffix ends the workers' dead-letter topics (the default of
// inbox.DeadLetterSuffixDefault), written by Ferry's workers, not by the
// producers a migration must move.
const deadLetterSuffix = ".dlq"

// Producers reads the old channel's topics of plan p and returns, per
// topic, the distinct producer ids of the records whose timestamp falls in
// the window, with what each wrote: the producers that must be moved (or
// bridged) before the old channel is retired. Each partition is read from
// the first offset the broker's time index gives for the window's start
// (kadm's ListOffsetsAfterMilli) to its end at the time of the call; a
// record whose timestamp is before the window (a producer may set any) is
// passed over. Everything in the window is read, since a producer that
// writes once a month matters as much as a busy one: ctx bounds the time
// it may take, and an expired ctx is an error, never a partial answer.
//
// Without ProducersOpts.Topics, the topics are those in which the groups
// committed offsets on the old cluster, except Kafka's internal topics
// (__*), ReportTopic and dead-letter topics (*.dlq), and, when the new
// channel has the same brokers, the topics its template claims (a topic
// both templates match goes to the one with the longer fixed part). The
// groups may consume topics that Ferry's relay does not write: those are
// read too, for their producers are the ones to find. A topic no group
// consumes is not seen: name the topics to read them.
func Producers(ctx context.Context, p Plan, opts *ProducersOpts) (*ProducersResult, error) {
	var o ProducersOpts
	if opts != nil {
		o = *opts
	}
	o.Window = cmp.Or(o.Window, ProducersWindowDefault)
	if o.Window < 0 {
		return nil, fmt.Errorf("migration: ProducersOpts.Window is %s: must be positive", o.Window)
	}
	if len(o.Groups) == 0 {
		o.Groups = p.Groups
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	base, err := p.Old.KafkaOpts("old", o.Getenv)
	if err != nil {
		return nil, err
	}
	// Control records are kept so that a partition whose last record is a
	// transaction marker is read to its end.
	cl, err := kgo.NewClient(append(base, kgo.KeepControlRecords())...)
	if err != nil {
		return nil, fmt.Errorf("migration: old channel: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	res := &ProducersResult{}
	topics := o.Topics
	if len(topics) == 0 {
		res.Groups = o.Groups
		if topics, err = committedTopics(ctx, adm, p, o.Groups); err != nil {
			return nil, err
		}
	}
	topics = sorted(topics)
	topics = slices.Compact(topics)
	res.Since = o.Now().Add(-o.Window)
	if len(topics) == 0 {
		res.Until = o.Now()
		return res, nil
	}
	starts, err := adm.ListOffsetsAfterMilli(ctx, res.Since.UnixMilli(), topics...)
	if err != nil {
		return nil, fmt.Errorf("migration: old channel: find the window's start (%s) in %s: %w",
			res.Since.UTC().Format(time.RFC3339), strings.Join(topics, ", "), err)
	}
	res.Until = o.Now()
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("migration: old channel: read the end of %s: %w", strings.Join(topics, ", "), err)
	}

	byTopic := make(map[string]*topicTally, len(topics))
	from := map[string]map[int32]kgo.Offset{}
	want := map[string]map[int32]int64{} // partitions not yet read to their end
	for _, t := range topics {
		byTopic[t] = &topicTally{TopicProducers: TopicProducers{Topic: t}, ids: map[int64]*Producer{}}
		if ps, ok := ends[t]; ok && ps[-1].Err != nil {
			if errors.Is(ps[-1].Err, kerr.UnknownTopicOrPartition) {
				byTopic[t].Missing = true
				continue
			}
			return nil, fmt.Errorf("migration: old channel: topic %s: %w", t, ps[-1].Err)
		}
		for part, end := range ends[t] {
			if end.Err != nil {
				return nil, fmt.Errorf("migration: old channel: end of %s/%d: %w", t, part, end.Err)
			}
			start, ok := starts.Lookup(t, part)
			if !ok || start.Err != nil {
				return nil, fmt.Errorf("migration: old channel: window start in %s/%d: %v", t, part, cmp.Or(start.Err, errors.New("not listed")))
			}
			if start.Offset < 0 || start.Offset >= end.Offset {
				continue // nothing in the window
			}
			if from[t] == nil {
				from[t], want[t] = map[int32]kgo.Offset{}, map[int32]int64{}
			}
			from[t][part] = kgo.NewOffset().At(start.Offset)
			want[t][part] = end.Offset
		}
		if _, ok := ends[t]; !ok {
			byTopic[t].Missing = true
		}
	}

	cl.AddConsumePartitions(from)
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			left := 0
			for _, ps := range want {
				left += len(ps)
			}
			return nil, fmt.Errorf("migration: old channel: %d partitions not read to their end: %w", left, err)
		}
		var ferr error
		fs.EachError(func(t string, part int32, err error) {
			var loss *kgo.ErrDataLoss // retention deleted the window's start: read on from the new start
			if ferr == nil && !errors.As(err, &loss) && !kerr.IsRetriable(err) {
				ferr = fmt.Errorf("migration: old channel: read %s/%d: %w", t, part, err)
			}
		})
		if ferr != nil {
			return nil, ferr
		}
		fs.EachRecord(func(rec *kgo.Record) {
			if end, ok := want[rec.Topic][rec.Partition]; ok && rec.Offset+1 >= end {
				delete(want[rec.Topic], rec.Partition)
				if len(want[rec.Topic]) == 0 {
					delete(want, rec.Topic)
				}
			}
			if !rec.Attrs.IsControl() && !rec.Timestamp.Before(res.Since) {
				byTopic[rec.Topic].add(rec)
			}
		})
	}
	for _, t := range topics {
		res.Topics = append(res.Topics, byTopic[t].result())
	}
	return res, nil
}

// topicTally counts a topic's records by producer id while they are read.
type topicTally struct {
	TopicProducers
	ids map[int64]*Producer
}

func (t *topicTally) add(rec *kgo.Record) {
	t.Records++
	id := rec.ProducerID
	if id < 0 {
		id = UnknownProducer
	}
	pr := t.ids[id]
	if pr == nil {
		pr = &Producer{ID: id, FirstSeen: rec.Timestamp, LastSeen: rec.Timestamp}
		t.ids[id] = pr
	}
	pr.Records++
	pr.FirstSeen = minTime(pr.FirstSeen, rec.Timestamp)
	pr.LastSeen = maxTime(pr.LastSeen, rec.Timestamp)
	for _, h := range rec.Headers {
		if h.Key == route.HeaderRoute || h.Key == route.HeaderFence {
			pr.Stamped++
			break
		}
	}
}

func (t *topicTally) result() TopicProducers {
	out := t.TopicProducers
	out.Unknown.ID = UnknownProducer
	for id, pr := range t.ids {
		if id == UnknownProducer {
			out.Unknown = *pr
			continue
		}
		out.Producers = append(out.Producers, *pr)
	}
	slices.SortFunc(out.Producers, func(a, b Producer) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// fetchOffsets reads group's committed offsets, waiting out (within ctx)
// the errors of a coordinator that is not ready yet, as on a cluster that
// just started or moved the group.
func fetchOffsets(ctx context.Context, adm *kadm.Client, group string) (kadm.OffsetResponses, error) {
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		offs, err := adm.FetchOffsets(ctx, group)
		if err == nil || !kerr.IsRetriable(err) {
			return offs, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}

// committedTopics are the topics in which groups committed offsets on the
// old cluster, less those Producers leaves out.
func committedTopics(ctx context.Context, adm *kadm.Client, p Plan, groups []string) ([]string, error) {
	sameCluster := slices.Equal(sorted(p.Old.Brokers), sorted(p.New.Brokers))
	oldT, newT := newTopicPattern(p.Old.TopicTemplate), newTopicPattern(p.New.TopicTemplate)
	var out []string
	for _, g := range groups {
		offs, err := fetchOffsets(ctx, adm, g)
		if err != nil {
			return nil, fmt.Errorf("migration: old channel: committed offsets of group %s: %w", g, err)
		}
		for t := range offs {
			switch {
			case strings.HasPrefix(t, "__"), t == ReportTopic, strings.HasSuffix(t, deadLetterSuffix):
			case sameCluster && newT.claims(t, oldT):
			default:
				out = append(out, t)
			}
		}
	}
	return out, nil
}

// topicPattern matches the topics a template makes.
type topicPattern struct {
	re    *regexp.Regexp
	fixed int // the template's length without its placeholders
}

var templatePlaceholder = regexp.MustCompile(`\\\{(aggregate_type|event_type)\\\}`)

func newTopicPattern(template string) topicPattern {
	quoted := regexp.QuoteMeta(template)
	re := regexp.MustCompile("^" + templatePlaceholder.ReplaceAllString(quoted, ".+") + "$")
	fixed := len(strings.NewReplacer("{aggregate_type}", "", "{event_type}", "").Replace(template))
	return topicPattern{re: re, fixed: fixed}
}

// claims reports whether topic is this template's rather than other's: it
// matches this one, and not other, or other less closely.
func (tp topicPattern) claims(topic string, other topicPattern) bool {
	if !tp.re.MatchString(topic) {
		return false
	}
	return !other.re.MatchString(topic) || tp.fixed > other.fixed
}
