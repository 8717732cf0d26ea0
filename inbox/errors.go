package inbox

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/pgerr"
)

// DeadLetterReason is why a message went to the dead-letter topic, in its
// HeaderDeadLetterReason header.
type DeadLetterReason string

// The reasons a message goes to the dead-letter topic.
const (
	// ReasonPermanent: the handler returned an error marked with Permanent.
	ReasonPermanent DeadLetterReason = "permanent"
	// ReasonUndecodable: the handler returned an error marked with
	// Undecodable, or the id header is not a usable message id.
	ReasonUndecodable DeadLetterReason = "undecodable"
	// ReasonMissingID: the record has no id header, so it cannot be
	// deduplicated (see Config.IDFromPayloadHash).
	ReasonMissingID DeadLetterReason = "missing_id"
	// ReasonRetriesExhausted: the handler failed Config.MaxAttempts times.
	ReasonRetriesExhausted DeadLetterReason = "retries_exhausted"
)

// ErrInboxMissing is returned by Run and Status when the inbox table does
// not exist: run `worker schema` (or schema.Up) first.
var ErrInboxMissing = errors.New("inbox: the inbox table does not exist: apply Ferry's migrations (`worker schema`)")

// ErrRetentionTooShort is returned, wrapped, when a dedupe window is below
// its safety minimum. See PruneConfig.InboxRetentionMin.
var ErrRetentionTooShort = errors.New("inbox retention is below the safety minimum")

// PermanentError marks a handler error that retrying cannot cure. The
// message goes to the dead-letter topic at once. Match it with errors.As.
type PermanentError struct {
	Reason DeadLetterReason // ReasonPermanent or ReasonUndecodable
	Err    error
}

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return string(e.Reason)
	}
	return e.Err.Error()
}

func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as permanent: the worker does not retry the message
// and writes it to the dead-letter topic with reason "permanent". Use it for
// errors that will be the same on every attempt (a reference to something
// that does not exist, a rule the message breaks). Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Reason: ReasonPermanent, Err: err}
}

// Undecodable is Permanent for a payload the handler cannot parse; the dead
// letter's reason is "undecodable". Undecodable(nil) is nil.
func Undecodable(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Reason: ReasonUndecodable, Err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent or Undecodable.
func IsPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}

// databaseUnreachable reports whether err means the database, not the
// message, is the problem: the transaction's connection is closed, or
// pgerr.Unreachable says the connection broke or the server refuses
// connections. Such failures are retried without limit and never
// dead-letter a message.
func databaseUnreachable(tx pgx.Tx, err error) bool {
	if err == nil {
		return false
	}
	if tx != nil && tx.Conn() != nil && tx.Conn().IsClosed() {
		return true
	}
	return pgerr.Unreachable(err)
}

// databaseAtFault reports whether a failed transaction is the database's
// doing rather than the message's: the database is unreachable, or the
// server aborted the transaction for a deadlock or a serialization failure
// (pgerr.Transient), which the same work in a new transaction normally
// escapes. Such failures are retried with backoff, without limit; they are
// not attempts and never dead-letter a message.
func databaseAtFault(tx pgx.Tx, err error) bool {
	return databaseUnreachable(tx, err) || pgerr.Transient(err)
}

// databaseFailure names a failure databaseAtFault accepted, for a log line.
func databaseFailure(err error) string {
	if pgerr.Transient(err) {
		return "transaction aborted by a deadlock or a serialization failure"
	}
	return "database unavailable"
}

// errorText shortens an error for a Kafka header and a log line.
func errorText(err error) string {
	const limit = 4 << 10
	s := err.Error()
	if len(s) > limit {
		s = s[:limit] + "...(truncated)"
	}
	return s
}

// panicError turns a recovered handler panic into an ordinary, retried error.
func panicError(v any) error {
	return fmt.Errorf("handler panicked: %v", v)
}
