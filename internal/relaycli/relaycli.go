// Package relaycli is the command line of the relay binary: `relay run`,
// `relay migrate`, `relay status`.
package relaycli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/relay"
)

const usage = `relay publishes Ferry's outbox to Kafka.

Usage:
  relay run                        publish outbox events to Kafka until SIGTERM
  relay status                     show the slot, confirmed LSN, retained WAL, quarantine
  relay quarantine list            events Kafka refused, with their reasons
  relay quarantine requeue --id ID|--all
                                   publish quarantined events again once the cause is fixed
  relay migrate [up|down|status]   apply Ferry's schema migrations; up also creates
                                   the publication and slot (--no-slot: schema only)
  relay help                       show this text

Settings come from flags or the environment; run "relay <command> -h".
`

// Main runs the relay command line and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Dispatch(ctx, "relay", usage, map[string]cli.Command{
		"run": func(ctx context.Context, args []string, _, stderr io.Writer) error {
			return runRelay(ctx, args, stderr)
		},
		"status":     runStatus,
		"quarantine": runQuarantine,
		"migrate":    runMigrate,
	}, args, stdout, stderr)
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("relay migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	publication := fs.String("publication", cli.Env("FERRY_PUBLICATION", relay.PublicationDefault), "publication on the outbox table (env FERRY_PUBLICATION)")
	noSlot := fs.Bool("no-slot", false, "apply the schema only; do not create the publication and slot")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger, err := c.logger(stderr)
	if err != nil {
		return err
	}
	action := fs.Arg(0)
	if err := cli.Migrate(ctx, c.databaseURL, action, stdout, logger); err != nil {
		return err
	}
	if *noSlot || (action != "" && action != "up") {
		return nil
	}
	// The slot keeps every transaction that commits after it exists: made
	// now, before the application's first event, nothing is ever missed.
	pool, err := pgxpool.New(ctx, c.databaseURL)
	if err != nil {
		return errors.New("--database-url is not a valid PostgreSQL connection string")
	}
	defer pool.Close()
	if err := relay.Setup(ctx, pool, c.slot, *publication, logger); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "publication %s and slot %s are ready\n", *publication, c.slot)
	return nil
}
