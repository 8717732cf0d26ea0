package relaycli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/relay"
)

func runQuarantine(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "requeue") {
		return errors.New("want `relay quarantine list` or `relay quarantine requeue --id ID|--all`")
	}
	fs := flag.NewFlagSet("relay quarantine "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	limit := fs.Int("limit", 100, "list at most this many events")
	ids := fs.String("id", "", "requeue these event ids (comma-separated)")
	all := fs.Bool("all", false, "requeue every quarantined event")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if _, err := c.logger(stderr); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, c.databaseURL)
	if err != nil {
		return errors.New("--database-url is not a valid PostgreSQL connection string")
	}
	defer pool.Close()

	if args[0] == "list" {
		rows, err := relay.Quarantined(ctx, pool, *limit)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tQUARANTINED\tTOPIC\tREASON\tBYTES\tERROR")
		for _, r := range rows {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, r.QuarantinedAt.Format("2006-01-02 15:04:05Z07:00"), r.Topic, r.Reason, len(r.Payload), r.Error)
		}
		return w.Flush()
	}

	var list []uuid.UUID
	switch {
	case *all && *ids != "":
		return errors.New("--id and --all exclude each other")
	case *all:
	case *ids == "":
		return errors.New("requeue needs --id ID[,ID...] or --all")
	default:
		for _, s := range strings.Split(*ids, ",") {
			id, err := uuid.Parse(strings.TrimSpace(s))
			if err != nil {
				return fmt.Errorf("--id %q: not a UUID", s)
			}
			list = append(list, id)
		}
	}
	n, err := relay.Requeue(ctx, pool, list)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "requeued %d events into the outbox; the relay publishes them again\n", n)
	return nil
}
