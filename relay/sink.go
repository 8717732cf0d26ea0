package relay

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Sink is where the relay publishes records. *kgo.Client is one; a router
// over two clusters (for a live broker migration) can be another.
//
// Produce must call promise exactly once per record, and keep records of one
// partition in order. AbortBufferedRecords fails every record not yet
// acknowledged; the relay calls it before it resends from its confirmed
// position, so no stale record lands after a resent one.
type Sink interface {
	Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))
	AbortBufferedRecords(ctx context.Context) error
}

var _ Sink = (*kgo.Client)(nil)
