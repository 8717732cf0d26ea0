// Package workercmd is the worker command line: `worker run`, `worker
// prune`, `worker dlq list|redrive`, `worker migrate` and `worker
// scaffold`. It is public so
// that an application's own main can host its handlers:
//
//	func main() {
//		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//		code := workercmd.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, func(w *inbox.Worker) error {
//			w.Handle("stock.reservation", "outbox.event.order", reserveStock)
//			return nil
//		})
//		stop()
//		os.Exit(code)
//	}
//
// Every setting is a flag with an environment variable of the same name
// (FERRY_...); `worker <command> -h` lists them.
package workercmd

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"os"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/cli"
)

// Register adds handlers (and middleware) to the worker that `worker run`
// hosts. It runs before the worker starts.
type Register func(w *inbox.Worker) error

const usage = `worker applies Ferry's Kafka messages exactly once through the inbox.

Usage:
  worker run                       consume and apply messages until SIGTERM
  worker prune                     delete expired inbox and outbox rows
  worker dlq list --topic T        show dead letters: what, why, when, from where
  worker dlq redrive --topic T     republish dead letters with their original id
  worker migrate [up|down|status]  apply Ferry's schema migrations
  worker scaffold NAME --dir PATH  write a new worker (handler, test, migration, main)
  worker help                      show this text

Settings come from flags or the environment; run "worker <command> -h".
`

// Main runs the worker command line with the handlers that register adds
// and returns the exit code: 0 on success (and after SIGTERM drained `run`),
// 1 on failure, 2 on a usage error.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, register ...Register) int {
	return cli.Dispatch(ctx, "worker", usage, map[string]cli.Command{
		"run": func(ctx context.Context, args []string, _, stderr io.Writer) error {
			return runWorker(ctx, args, stderr, register)
		},
		"prune":   runPrune,
		"dlq":     runDLQ,
		"migrate": runMigrate,
		"scaffold": func(_ context.Context, args []string, stdout, stderr io.Writer) error {
			return runScaffold(args, stdout, stderr)
		},
	}, args, stdout, stderr)
}

// usageError is a wrong command line, exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// Unwrap makes cli.Dispatch exit 2 for it.
func (e usageError) Unwrap() error { return cli.ErrUsage }

// logging are the flags every subcommand shares.
type logging struct {
	format, level string
}

func (l *logging) register(fs *flag.FlagSet) {
	fs.StringVar(&l.format, "log-format", cli.Env("FERRY_LOG_FORMAT", cli.LogFormatAuto), "auto, text or json (env FERRY_LOG_FORMAT)")
	fs.StringVar(&l.level, "log-level", cli.Env("FERRY_LOG_LEVEL", "info"), "debug, info, warn or error (env FERRY_LOG_LEVEL)")
}

func (l *logging) logger() (*slog.Logger, error) {
	return cli.NewLogger(os.Stderr, l.format, l.level)
}

func databaseURLFlag(fs *flag.FlagSet) *string {
	return fs.String("database-url", cli.Env("FERRY_DATABASE_URL", ""), "PostgreSQL URL (env FERRY_DATABASE_URL)")
}

func needDatabaseURL(url string) error {
	if url == "" {
		return usageError{"--database-url (FERRY_DATABASE_URL) is required"}
	}
	return nil
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("worker migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := databaseURLFlag(fs)
	var l logging
	l.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := needDatabaseURL(*dbURL); err != nil {
		return err
	}
	logger, err := l.logger()
	if err != nil {
		return err
	}
	return cli.Migrate(ctx, *dbURL, fs.Arg(0), stdout, logger)
}
