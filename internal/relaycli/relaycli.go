// Package relaycli is the command line of the relay binary: `relay run`,
// `relay migrate`, `relay status`.
package relaycli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/ferryhq/ferry/internal/cli"
)

const usage = `relay publishes Ferry's outbox to Kafka.

Usage:
  relay run                        publish outbox events to Kafka until SIGTERM
  relay status                     show the slot, confirmed LSN, retained WAL, quarantine
  relay migrate [up|down|status]   apply Ferry's schema migrations
  relay help                       show this text

Settings come from flags or the environment; run "relay <command> -h".
`

// Main runs the relay command line and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "run":
		err = runRelay(ctx, args[1:], stderr)
	case "status":
		err = runStatus(ctx, args[1:], stdout, stderr)
	case "migrate":
		err = runMigrate(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "relay: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "relay %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("relay migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", cli.Env("FERRY_DATABASE_URL", ""), "PostgreSQL URL (env FERRY_DATABASE_URL)")
	logFormat := fs.String("log-format", cli.Env("FERRY_LOG_FORMAT", cli.LogFormatAuto), "auto, text or json (env FERRY_LOG_FORMAT)")
	logLevel := fs.String("log-level", cli.Env("FERRY_LOG_LEVEL", "info"), "debug, info, warn or error (env FERRY_LOG_LEVEL)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" {
		return errors.New("--database-url (FERRY_DATABASE_URL) is required")
	}
	logger, err := cli.NewLogger(os.Stderr, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	return cli.Migrate(ctx, *dbURL, fs.Arg(0), stdout, logger)
}
