package relay

import "github.com/jackc/pglogrepl"

// InjectSlotFault makes the recoveries of a relay built from cfg run
// fault(attempt)'s statement on their replication connection in place of
// their attempt-th CREATE_REPLICATION_SLOT, when it returns one: the
// server's own error, delivered as a refused command would be.
func InjectSlotFault(cfg *Config, fault func(attempt int) string) { cfg.slotFault = fault }

// HoldConfirmedFlush makes the status updates of a relay built from cfg
// confirm no further than lsn to PostgreSQL, whatever the relay confirmed
// and recorded: the slot's state after a crash that came before the next
// status update.
func HoldConfirmedFlush(cfg *Config, lsn string) error {
	at, err := pglogrepl.ParseLSN(lsn)
	cfg.holdFlush = uint64(at)
	return err
}

// BeforeStartReplication makes every session of a relay built from cfg call
// hook after it read the slot's state and before its START_REPLICATION.
func BeforeStartReplication(cfg *Config, hook func()) { cfg.beforeStart = hook }
