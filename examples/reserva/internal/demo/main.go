// Package demo is the reserva command: its migrations, its order API and
// the one-command demo that runs the whole system.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/relay"
	"github.com/ferryhq/ferry/schema"
)

const usage = `reserva is the order + stock-reservation example built on Ferry.

Usage:
  reserva migrate [-database-url URL]     Ferry's and reserva's tables, the relay's slot
  reserva api [-addr :8080]               the order service: POST /orders, GET /orders/{id}
  reserva demo [-once] [-orders N] [-broker kafka|rabbitmq]
                                          start relay, workers and API, place orders, print a summary
                                          (-broker rabbitmq: over the stack's RabbitMQ instead of Kafka)
  reserva demo-migration [-once] [-from kafka|rabbitmq]
                                          the same, moving live from Kafka cluster A to B while orders flow
                                          (-from rabbitmq: from the stack's RabbitMQ to B, with a producer
                                          that is not Ferry's bridged by relay bridge)

The workers are reserva's own worker binary (examples/reserva/cmd/reserva-worker),
Ferry's worker command line hosting reserva's handlers.
`

// Main runs the reserva command line and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Dispatch(ctx, "reserva", usage, map[string]cli.Command{
		"migrate":        runMigrate,
		"api":            func(ctx context.Context, args []string, _, stderr io.Writer) error { return runAPI(ctx, args, stderr) },
		"demo":           runDemo,
		"demo-migration": runMigrationDemo,
	}, args, stdout, stderr)
}

// Migrate applies Ferry's and reserva's migrations and makes the relay's
// publication and slot, so that no order placed afterwards is missed.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := schema.Up(ctx, db); err != nil {
		return err
	}
	m, err := schema.New(db, reserva.Migrations, logger)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	return relay.Setup(ctx, pool, relay.SlotDefault, relay.PublicationDefault, logger)
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags("reserva migrate", stderr)
	var db cli.Database
	db.Register(f)
	if err := f.Parse(args); err != nil {
		return err
	}
	pool, err := db.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := Migrate(ctx, pool, nil); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "reserva: schema, publication and slot are ready")
	return nil
}

func runAPI(ctx context.Context, args []string, stderr io.Writer) error {
	f := cli.NewFlags("reserva api", stderr)
	var base cli.Base
	base.Register(f)
	addr := f.FlagSet.String("addr", ":8080", "listen address")
	logger, err := base.Parse(f, args, stderr)
	if err != nil {
		return err
	}
	stopTracing, err := cli.StartTracing(ctx, "reserva-api", logger)
	if err != nil {
		return err
	}
	defer stopTracing()
	pool, err := base.DB.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	srv := reserva.NewService(pool, logger).Server(*addr)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	logger.Info("order API listening", slog.String("addr", *addr), slog.String("database", base.DB.Redacted()))
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
