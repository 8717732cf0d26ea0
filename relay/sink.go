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
// acknowledged; the relay calls it when a session fails, with a 10-second
// deadline, before it resends from its confirmed position, so no stale
// record lands after a resent one.
//
// If AbortBufferedRecords returns an error, the relay logs it and carries
// on with the same Sink: it cannot replace one it was given. franz-go
// documents that an abort cut short by its context may leave a *kgo.Client
// invalid, with the aborted records still buffered and sent later, so a
// Sink built on one should close and replace its client itself before it
// returns, as the relay's own Sink (Config.Sink nil) does. A bare
// *kgo.Client given as Config.Sink is used on as it is.
type Sink interface {
	Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))
	AbortBufferedRecords(ctx context.Context) error
}

var _ Sink = (*kgo.Client)(nil)
