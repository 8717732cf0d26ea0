package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/dbsqlc"
)

// claimLockClass is the first key of the advisory locks that serialise
// claims of one message in a partitioned inbox ("FRY1"): the two-key lock
// space is apart from the one-key space that applications (and goose, for
// migrations) use most.
const claimLockClass = 0x46525931

// sharedLockClass is the first key of the advisory locks on the shared
// resources handlers name (HandleOpts.Locks, "FRY2"), apart from the
// claims' locks.
const sharedLockClass = 0x46525932

// ErrIsolation is returned, wrapped, when a partitioned inbox is claimed
// in a transaction that is not READ COMMITTED (default_transaction_isolation
// of the database or the role): the claim could not see a claim committed
// while it waited, and would apply a message twice. The worker refuses to
// start.
var ErrIsolation = errors.New("inbox: a partitioned inbox needs READ COMMITTED transactions")

// claim records that consumer applies the messages of ids in tx and returns
// those no earlier transaction claimed, each once. In a plain inbox the
// primary key (consumer, message_id) turns a second claim into a conflict.
// A partitioned inbox (schema.PartitionInbox) has no index across its
// partitions, so a message applied yesterday would not conflict with
// today's copy: there a claim first locks its (consumer, message id), which
// a second claim waits for until the first commits or rolls back, and then,
// in a statement of its own and so with a snapshot taken after the wait,
// inserts only the ids no partition holds. Exactly once either way.
func (w *Worker) claim(ctx context.Context, tx pgx.Tx, consumer string, ids []string) ([]string, error) {
	q := w.queries
	if !w.partitionedInbox {
		return q.InboxInsertMany(ctx, tx, dbsqlc.InboxInsertManyParams{Consumer: consumer, MessageIds: ids})
	}
	return claimPartitioned(ctx, q, tx, consumer, ids)
}

func claimPartitioned(ctx context.Context, q *dbsqlc.Queries, tx pgx.Tx, consumer string, ids []string) ([]string, error) {
	lock, err := q.InboxClaimLock(ctx, tx, dbsqlc.InboxClaimLockParams{LockClass: claimLockClass, Consumer: consumer, MessageIds: ids})
	if err != nil {
		return nil, err
	}
	if lock.Isolation != "read committed" {
		return nil, fmt.Errorf("%w: this transaction is %s", ErrIsolation, lock.Isolation)
	}
	return q.InboxClaimMany(ctx, tx, dbsqlc.InboxClaimManyParams{Consumer: consumer, MessageIds: ids})
}

// claimOne is claim of one message: whether this transaction claimed it.
func (w *Worker) claimOne(ctx context.Context, tx pgx.Tx, consumer, id string) (bool, error) {
	if !w.partitionedInbox {
		n, err := w.queries.InboxInsert(ctx, tx, dbsqlc.InboxInsertParams{Consumer: consumer, MessageID: id})
		return n == 1, err
	}
	claimed, err := claimPartitioned(ctx, w.queries, tx, consumer, []string{id})
	return len(claimed) == 1, err
}
