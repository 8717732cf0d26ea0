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
		return func(cfg *inbox.Config, logger *slog.Logger) {
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
