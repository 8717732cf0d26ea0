// Package relaycli is the command line of the relay binary: `relay run`,
// `relay status`, `relay prune`, `relay recover`, `relay quarantine`,
// `relay migration`, `relay bridge`, `relay schema` (alias `relay migrate`).
// Its shape is the
// worker's (cmd/worker/workercli): the settings every Ferry binary shares
// come from internal/cli, each with one validation, and errors follow one
// exit-code rule (see cli.Dispatch).
package relaycli

import (
	"context"
	"fmt"
	"io"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/relay"
	"github.com/ferryhq/ferry/schema"
)

const usage = `relay publishes Ferry's outbox to Kafka.

Usage:
  relay run                        publish outbox events to Kafka until SIGTERM
  relay status                     show the slot, confirmed LSN, retained WAL, quarantine
  relay prune                      delete expired outbox rows the slot has confirmed
  relay recover                    replace a slot that is gone or lost: a new slot, then
                                   the outbox republished since the last confirmed commit
  relay quarantine list            events Kafka refused, with their reasons
  relay quarantine requeue --id ID|--all
                                   publish quarantined events again once the cause is fixed
                                   (with the events quarantined behind them, in order)
  relay quarantine discard --id ID|--all
                                   delete quarantined events for good: never published
  relay migration create NAME --old-brokers H:P --old-topic-template T
                   --new-brokers H:P --new-topic-template T --groups G[,G...]
                                   record a live broker migration plan, in OLD_ONLY
                                   (TLS and SASL: --old-tls, --new-sasl-mechanism, ...;
                                   a SASL password by the name of its variable only:
                                   --new-sasl-password-env VAR)
  relay migration list             every plan: phase, slices moved, epoch, since
  relay migration status NAME      a plan's phase, channels, groups and last requests, each
                                   group's newest report, and the old channel's producers
  relay migration request NAME PHASE [--slices K]
                                   ask to move a plan to OLD_ONLY, DUAL_WRITE, CUTOVER or
                                   OLD_RETIRED; recorded either way, exit 1 when rejected
  relay migration history NAME     every request of a plan: who, when, from, to, why
  relay bridge --plan NAME --topics T[,T...] [--topic-map OLD=NEW]
                                   copy the records of producers that are not Ferry's from
                                   a plan's old channel to its new one, stamped with the
                                   plan's step; offsets committed once the new cluster acked;
                                   /readyz (:9189) names a topic the old cluster lacks
  relay schema [up|down|status]    apply Ferry's schema migrations; up also creates
                                   the publication and slot (--no-slot: schema only;
                                   --outbox-partitioning daily: an empty outbox
                                   partitioned by day); down rolls back one, with --yes;
                                   "relay migrate" is the same command
  relay version                    print the version and the commit it was built from
  relay --version                  the same
  relay help                       show this text

Settings come from flags or the environment; run "relay <command> -h".
Exit codes: 0 done, 1 failed, 2 wrong command line.
`

// Main runs the relay command line and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Dispatch(ctx, "relay", usage, map[string]cli.Command{
		"run":        runRelay,
		"status":     runStatus,
		"prune":      runPrune,
		"recover":    runRecover,
		"quarantine": runQuarantine,
		"schema":     runMigrate,
		"migrate":    runMigrate, // the schema command's first name, kept
		"migration":  runMigration,
		"bridge":     runBridge,
	}, args, stdout, stderr)
}

// common are the settings every relay subcommand shares.
type common struct {
	cli.Base
	slot string
}

func (c *common) register(f *cli.Flags) {
	c.Base.Register(f)
	f.StringVar(&c.slot, "slot", relay.SlotDefault, "logical replication slot")
}

// parse is Base.Parse, then the check `relay run` makes of --slot.
func (c *common) parse(f *cli.Flags, args []string, stderr io.Writer) error {
	if _, err := c.Parse(f, args, stderr); err != nil {
		return err
	}
	return checkNameFlag("slot", c.slot)
}

// checkNameFlag refuses, by flag, a slot or publication name relay.Config
// refuses: before a command reads or changes anything.
func checkNameFlag(flag, name string) error {
	if err := relay.CheckName(name); err != nil {
		return cli.Usagef("--%s (%s) %w", flag, cli.EnvName(flag), err)
	}
	return nil
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags("relay schema", stderr)
	var m cli.MigrateFlags
	m.Register(f)
	slot := f.String("slot", relay.SlotDefault, "logical replication slot")
	publication := f.String("publication", relay.PublicationDefault, "publication on the outbox table")
	noSlot := f.FlagSet.Bool("no-slot", false, "apply the schema only; do not create the publication and slot")
	// Before the publication: a new one then starts with the partitioned
	// outbox, an existing one is moved to it.
	m.RegisterPartitioning(f, "outbox", schema.PartitionOutbox)
	logger, err := m.Parse(f, args, stderr)
	if err != nil {
		return err
	}
	action := f.Arg(0)
	if !*noSlot && (action == "" || action == "up") {
		// Checked before the schema is applied, not after.
		if err := checkNameFlag("slot", *slot); err != nil {
			return err
		}
		if err := checkNameFlag("publication", *publication); err != nil {
			return err
		}
	}
	if err := m.Migrate(ctx, action, stdout, logger); err != nil {
		return err
	}
	if *noSlot || (action != "" && action != "up") {
		return nil
	}
	// The slot keeps every transaction that commits after it exists: made
	// now, before the application's first event, nothing is ever missed.
	pool, err := m.DB.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := relay.Setup(ctx, pool, *slot, *publication, logger); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "publication %s and slot %s are ready\n", *publication, *slot)
	return nil
}
