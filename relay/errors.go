package relay

import (
	"errors"
	"fmt"
)

// ErrFatal marks errors that restarting cannot cure; Run returns them.
var ErrFatal = errors.New("fatal")

// Fatal errors returned by Run. Match them with errors.Is.
var (
	// ErrSlotLost means PostgreSQL invalidated the slot (wal_status = lost):
	// WAL the relay had not confirmed is gone, so events may be missing
	// from Kafka. Ferry never recreates the slot by itself.
	ErrSlotLost = fmt.Errorf("%w: replication slot lost", ErrFatal)
	// ErrPublicationMissing means the publication does not exist (or does not
	// cover outbox) and the relay may not create it.
	ErrPublicationMissing = fmt.Errorf("%w: publication missing", ErrFatal)
	// ErrSlotMissing means the slot does not exist and the relay may not
	// create it.
	ErrSlotMissing = fmt.Errorf("%w: replication slot missing", ErrFatal)
	// ErrOutboxMissing means the outbox table does not exist: run migrations.
	ErrOutboxMissing = fmt.Errorf("%w: outbox table missing", ErrFatal)
	// ErrWALLevel means wal_level is not logical.
	ErrWALLevel = fmt.Errorf("%w: wal_level is not logical", ErrFatal)
)
