//go:build ferryfault

package workercli

import (
	"flag"
	"log/slog"

	"github.com/ferryhq/ferry/inbox"
)

// The fault suite builds its worker with the ferryfault tag, which adds the
// negative controls' flags to `run`. A release binary has no such flag.
func init() {
	negativeControls = func(fs *flag.FlagSet) func(*inbox.Config, *slog.Logger) {
		commit := fs.Bool("unsafe-commit-before-db", false, "NEGATIVE CONTROL ONLY: commit Kafka offsets before the database transaction, which loses effects on a crash")
		noQuarantine := fs.Bool("unsafe-no-migration-quarantine", false, "NEGATIVE CONTROL ONLY: never quarantine a live migration's events whose authoritative copy was lost, which leaves them unapplied and unaccounted")
		ackEarly := fs.Bool("unsafe-ack-before-db", false, "NEGATIVE CONTROL ONLY (RabbitMQ): acknowledge each delivery before its database transaction, which loses effects on a crash")
		requeue := fs.Bool("unsafe-requeue-retries", false, "NEGATIVE CONTROL ONLY (RabbitMQ): retry a failed delivery by Nack(requeue=true) instead of holding it, which reorders aggregates")
		return func(cfg *inbox.Config, logger *slog.Logger) {
			if *ackEarly {
				inbox.UnsafeAckBeforeDB(cfg)
				logger.Warn("NEGATIVE CONTROL: --unsafe-ack-before-db acknowledges RabbitMQ deliveries before the database; effects will be lost on a crash")
			}
			if *requeue {
				inbox.UnsafeRequeueRetries(cfg)
				logger.Warn("NEGATIVE CONTROL: --unsafe-requeue-retries retries by requeue; aggregates will be applied out of order")
			}
			if *commit {
				inbox.UnsafeCommitOffsetsBeforeDB(cfg)
				logger.Warn("NEGATIVE CONTROL: --unsafe-commit-before-db commits offsets before the database; effects will be lost on a crash")
			}
			if *noQuarantine {
				inbox.UnsafeNoMigrationQuarantine(cfg)
				logger.Warn("NEGATIVE CONTROL: --unsafe-no-migration-quarantine leaves a migration's lost events unaccounted")
			}
		}
	}
}
