// Package workercli is the worker's command line: `run`, `status`,
// `prune`, `dlq list|redrive`, `schema` (alias `migrate`), `migration
// quarantine` and `scaffold`. Ferry's own
// `worker` binary runs it with no handlers, for the operations that need
// none; an application's worker binary runs it with its App, which adds
// `run` (hosting the application's handlers) and the application's own
// migrations:
//
//	func main() {
//		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//		code := workercli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, &workercli.App{
//			Name:       "billing-worker",
//			Register:   billing.Register,
//			Migrations: []schema.Set{billing.Migrations},
//		})
//		stop()
//		os.Exit(code)
//	}
//
// `worker scaffold NAME --dir PATH` writes such a main. Every setting is a
// flag with an environment variable (FERRY_...); `<binary> <command> -h`
// lists them. Its shape is the relay's (cmd/relay/relaycli).
package workercli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/schema"
)

// Register adds handlers (and middleware) to the worker that `run` hosts.
// It runs before the worker starts.
type Register func(w *inbox.Worker) error

// App is what an application's worker binary adds to Ferry's worker
// command line.
type App struct {
	// Name is the binary's name in help and error messages. Defaults to
	// "worker".
	Name string

	// Register adds the application's handlers. Without it there is no
	// `run` command.
	Register Register

	// Migrations are the application's own migration sets, applied by
	// `schema up` after Ferry's, in order. Defaults to none.
	Migrations []schema.Set
}

const usageText = `%[1]s applies Ferry's Kafka or RabbitMQ messages exactly once through the inbox.

Usage:
%[2]s  %[1]s status --consumer C      consumer groups' lag and inbox rows
  %[1]s prune                     delete inbox rows older than the dedupe window
  %[1]s dlq list --topic T        show dead letters: what, why, when, from where
  %[1]s dlq redrive --topic T     republish dead letters with their original id
  %[1]s schema [up|down|status]   apply Ferry's schema migrations%[3]s
                                  (--inbox-partitioning daily: an empty inbox
                                  partitioned by day); down rolls back one, with --yes;
                                  "%[1]s migrate" is the same command
                                  with --rabbitmq-url, also declares the consumers'
                                  RabbitMQ queues: a queue receives only what is
                                  published after it exists, so declare it before
                                  the relay publishes what the consumer must see
  %[1]s migration quarantine list|replay
                                  events of a live broker migration never applied
                                  (their authoritative copy lost): list, replay once
  %[1]s scaffold NAME --dir PATH  write a new worker (handler, test, migration, main)
  %[1]s version                   print the version and the commit it was built from
  %[1]s --version                 the same
  %[1]s help                      show this text

Settings come from flags or the environment; run "%[1]s <command> -h".
Exit codes: 0 done, 1 failed, 2 wrong command line.
`

// Main runs the worker command line for app (nil: Ferry's own worker
// binary, without `run`) and returns the exit code: 0 on success (and
// after SIGTERM drained `run`), 1 on failure, 2 on a wrong command line.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, app *App) int {
	if app == nil {
		app = &App{}
	}
	name := cmp.Or(app.Name, "worker")
	runLine, ownMigrations := "", ""
	if app.Register != nil {
		runLine = fmt.Sprintf("  %s run                       consume and apply messages until SIGTERM\n", name)
	}
	if len(app.Migrations) > 0 {
		ownMigrations = ", then the application's"
	}
	usage := fmt.Sprintf(usageText, name, runLine, ownMigrations)
	schemaCmd := func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return runMigrate(ctx, name, args, stdout, stderr, app.Migrations, app.Register)
	}
	return cli.Dispatch(ctx, name, usage, map[string]cli.Command{
		"run": func(ctx context.Context, args []string, _, stderr io.Writer) error {
			if app.Register == nil {
				return cli.Usagef("this binary hosts no handlers: `run` belongs to your own worker's main, " +
					"workercli.Main(ctx, args, stdout, stderr, &workercli.App{Register: ...}); " +
					"`worker scaffold NAME --dir PATH` writes one (docs/worker.md)")
			}
			return runWorker(ctx, name, args, stderr, app.Register)
		},
		"status": func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return runStatus(ctx, name, args, stdout, stderr)
		},
		"prune": func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return runPrune(ctx, name, args, stdout, stderr)
		},
		"dlq": func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return runDLQ(ctx, name, args, stdout, stderr)
		},
		"schema": schemaCmd,
		// The schema command's first name, kept.
		"migrate": schemaCmd,
		"migration": func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return runMigration(ctx, name, args, stdout, stderr)
		},
		"scaffold": func(_ context.Context, args []string, stdout, stderr io.Writer) error {
			return runScaffold(name, args, stdout, stderr)
		},
	}, args, stdout, stderr)
}

func runMigrate(ctx context.Context, name string, args []string, stdout, stderr io.Writer, own []schema.Set, register Register) error {
	f := cli.NewFlags(name+" schema", stderr)
	var m cli.MigrateFlags
	m.Register(f)
	m.RegisterPartitioning(f, "inbox", schema.PartitionInbox)
	var rabbit rabbitFlags
	rabbit.register(f)
	logger, err := m.Parse(f, args, stderr)
	if err != nil {
		return err
	}
	if err := m.Migrate(ctx, f.Arg(0), stdout, logger, own...); err != nil {
		return err
	}
	if verb := f.Arg(0); !rabbit.Enabled() || (verb != "" && verb != "up") {
		return nil
	}
	return declareQueues(ctx, name, &rabbit, register, stdout)
}

// splitList reads a comma-separated flag, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
