package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/pgerr"
	"github.com/ferryhq/ferry/outbox"
)

// ConsumerStatus is one consumer's state: its Kafka consumer group (named
// after the consumer) and its inbox rows.
type ConsumerStatus struct {
	Consumer string
	// GroupState is Kafka's state of the group: Stable, Empty, Dead,
	// PreparingRebalance, CompletingRebalance.
	GroupState string
	Members    int
	// Lag is, per topic, the records after the group's committed offsets.
	// A partition without a committed offset counts from its start.
	Lag map[string]int64
	// InboxMessages is how many message ids the inbox remembers for the
	// consumer; NewestApplied is when the newest was applied (zero if none).
	InboxMessages int64
	NewestApplied time.Time
}

// TotalLag is the lag over every topic.
func (s *ConsumerStatus) TotalLag() int64 {
	var n int64
	for _, l := range s.Lag {
		n += l
	}
	return n
}

// Status describes each consumer: its group's state and lag from Kafka and
// its inbox rows from db. kafkaOpts reach the cluster (seed brokers, TLS,
// SASL). The database is read first: one without the inbox table (Ferry's
// migrations not applied, or the wrong database) is ErrInboxMissing,
// whatever Kafka knows of the consumers.
func Status(ctx context.Context, db outbox.DBTX, kafkaOpts []kgo.Opt, consumers ...string) ([]ConsumerStatus, error) {
	if len(consumers) == 0 {
		return nil, nil
	}
	q := dbsqlc.New()
	out := make([]ConsumerStatus, 0, len(consumers))
	for _, c := range consumers {
		st := ConsumerStatus{Consumer: c, Lag: map[string]int64{}}
		var err error
		if st.InboxMessages, err = q.InboxCountByConsumer(ctx, db, c); err != nil {
			if pgerr.UndefinedTable(err) {
				return nil, ErrInboxMissing
			}
			return nil, fmt.Errorf("inbox: count inbox rows of %s: %w", c, err)
		}
		st.NewestApplied, err = q.InboxNewestByConsumer(ctx, db, c)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("inbox: read inbox of %s: %w", c, err)
		}
		out = append(out, st)
	}
	cl, err := kgo.NewClient(kafkaOpts...)
	if err != nil {
		return nil, fmt.Errorf("inbox: kafka client: %w", err)
	}
	defer cl.Close()
	lags, err := kadm.NewClient(cl).Lag(ctx, consumers...)
	if err != nil {
		return nil, fmt.Errorf("inbox: describe consumer groups: %w", err)
	}
	for i := range out {
		st := &out[i]
		g, ok := lags[st.Consumer]
		if !ok {
			continue
		}
		if err := errors.Join(g.DescribeErr, g.FetchErr); err != nil {
			return nil, fmt.Errorf("inbox: consumer group %s: %w", st.Consumer, err)
		}
		st.GroupState, st.Members = g.State, len(g.Members)
		for topic, tl := range g.Lag.TotalByTopic() {
			st.Lag[topic] = tl.Lag
		}
	}
	slices.SortFunc(out, func(a, b ConsumerStatus) int { return strings.Compare(a.Consumer, b.Consumer) })
	return out, nil
}
