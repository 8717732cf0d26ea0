package relaycli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/relay"
)

func runQuarantine(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "requeue") {
		return cli.Usagef("want `relay quarantine list` or `relay quarantine requeue --id ID|--all`")
	}
	f := cli.NewFlags("relay quarantine "+args[0], stderr)
	var c common
	c.register(f)
	limit := f.FlagSet.Int("limit", 100, "list at most this many events")
	ids := f.FlagSet.String("id", "", "requeue these event ids (comma-separated)")
	all := f.FlagSet.Bool("all", false, "requeue every quarantined event")
	if _, err := c.Parse(f, args[1:], stderr); err != nil {
		return err
	}
	var list []uuid.UUID
	if args[0] == "requeue" {
		var err error
		if list, err = requeueSelection(*ids, *all); err != nil {
			return err
		}
	}
	pool, err := c.DB.Pool(ctx)
	if err != nil {
		return err
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

	n, err := relay.Requeue(ctx, pool, list)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "requeued %d events into the outbox; the relay publishes them again\n", n)
	return nil
}

// requeueSelection reads --id and --all; nil means every event.
func requeueSelection(ids string, all bool) ([]uuid.UUID, error) {
	switch {
	case all && ids != "":
		return nil, cli.Usagef("--id and --all exclude each other")
	case all:
		return nil, nil
	case ids == "":
		return nil, cli.Usagef("requeue needs --id ID[,ID...] or --all")
	}
	var list []uuid.UUID
	for _, s := range strings.Split(ids, ",") {
		id, err := uuid.Parse(strings.TrimSpace(s))
		if err != nil {
			return nil, cli.Usagef("--id %q: not a UUID", s)
		}
		list = append(list, id)
	}
	return list, nil
}
