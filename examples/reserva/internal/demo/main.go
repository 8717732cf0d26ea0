// Package demo is the reserva command: its migrations, its order API and
// the one-command demo that runs the whole system.
package demo

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/relay"
)

const usage = `reserva is the order + stock-reservation example built on Ferry.

Usage:
  reserva migrate [-database-url URL]     Ferry's and reserva's tables, the relay's slot
  reserva api [-addr :8080]               the order service: POST /orders, GET /orders/{id}
  reserva demo [-once] [-orders N]        start relay, workers and API, place orders, print a summary

The workers are the worker binary (cmd/worker), which hosts reserva's handlers.
`

// Main runs the reserva command line and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Dispatch(ctx, "reserva", usage, map[string]cli.Command{
		"migrate": runMigrate,
		"api":     func(ctx context.Context, args []string, _, stderr io.Writer) error { return runAPI(ctx, args, stderr) },
		"demo":    runDemo,
	}, args, stdout, stderr)
}

// Migrate applies Ferry's and reserva's migrations and makes the relay's
// publication and slot, so that no order placed afterwards is missed.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrate.Up(ctx, db); err != nil {
		return err
	}
	m, err := migrate.New(db, reserva.Migrations, logger)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	return relay.Setup(ctx, pool, relay.SlotDefault, relay.PublicationDefault, logger)
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reserva migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", cli.Env("FERRY_DATABASE_URL", ""), "PostgreSQL URL (env FERRY_DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" {
		return errors.New("--database-url (FERRY_DATABASE_URL) is required")
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return errors.New("--database-url is not a valid PostgreSQL connection string")
	}
	defer pool.Close()
	if err := Migrate(ctx, pool, nil); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "reserva: schema, publication and slot are ready")
	return nil
}

func runAPI(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("reserva api", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", cli.Env("FERRY_DATABASE_URL", ""), "PostgreSQL URL (env FERRY_DATABASE_URL)")
	addr := fs.String("addr", cli.Env("RESERVA_ADDR", ":8080"), "listen address (env RESERVA_ADDR)")
	logFormat := fs.String("log-format", cli.Env("FERRY_LOG_FORMAT", cli.LogFormatAuto), "auto, text or json (env FERRY_LOG_FORMAT)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" {
		return errors.New("--database-url (FERRY_DATABASE_URL) is required")
	}
	logger, err := cli.NewLogger(stderr, *logFormat, "info")
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return errors.New("--database-url is not a valid PostgreSQL connection string")
	}
	defer pool.Close()
	srv := &http.Server{Addr: *addr, Handler: reserva.NewService(pool, logger).Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	logger.Info("order API listening", slog.String("addr", *addr), slog.String("database", cli.RedactURL(*dbURL)))
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
