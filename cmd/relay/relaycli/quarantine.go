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

const quarantineUsage = `Usage:
  relay quarantine list [--limit N]
  relay quarantine requeue (--id ID[,ID...] | --all)
  relay quarantine discard (--id ID[,ID...] | --all)

Events Kafka refused for good wait in outbox_quarantine with their reason.
Requeue puts them back into the outbox, with the events quarantined behind
them, once the cause is fixed; discard deletes them for good.
`

func runQuarantine(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && cli.IsHelp(args[0]) {
		fmt.Fprint(stdout, quarantineUsage)
		return nil
	}
	if len(args) == 0 || (args[0] != "list" && args[0] != "requeue" && args[0] != "discard") {
		return cli.Usagef("want `relay quarantine list`, `relay quarantine requeue --id ID|--all` or `relay quarantine discard --id ID|--all`")
	}
	verb := args[0]
	f := cli.NewFlags("relay quarantine "+verb, stderr)
	var c common
	c.register(f)
	limit, ids, all := new(int), new(string), new(bool)
	if verb == "list" {
		f.FlagSet.IntVar(limit, "limit", 100, "list at most this many events")
	} else {
		f.FlagSet.StringVar(ids, "id", "", verb+" these event ids (comma-separated)")
		f.FlagSet.BoolVar(all, "all", false, verb+" every quarantined event")
	}
	if _, err := c.Parse(f, args[1:], stderr); err != nil {
		return err
	}
	var list []uuid.UUID
	if verb != "list" {
		var err error
		if list, err = selection(verb, *ids, *all); err != nil {
			return err
		}
	}
	pool, err := c.DB.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if verb != "list" {
		// Say where it acts before it does: the database may come from the
		// environment rather than the command line.
		target, err := c.DB.Target()
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, target)
	}

	switch verb {
	case "list":
		rows, err := relay.ListQuarantined(ctx, pool, *limit)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tQUARANTINED\tTOPIC\tREASON\tBYTES\tERROR")
		for _, r := range rows {
			// The topic and the error come from event data: escaped and cut.
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, r.QuarantinedAt.Format("2006-01-02 15:04:05Z07:00"),
				cli.Cell(r.Topic, 100), cli.Cell(string(r.Reason), 40), len(r.Payload), cli.Cell(r.Error, 120))
		}
		return w.Flush()
	case "discard":
		n, err := relay.Discard(ctx, pool, list)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "discarded %d quarantined events for good: deleted from outbox_quarantine and the outbox, they will never be published\n", n)
		return nil
	}

	n, err := relay.Requeue(ctx, pool, list)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "requeued %d events into the outbox (with any quarantined behind them, in order); the relay publishes them again\n", n)
	return nil
}

// selection reads --id and --all for verb; nil means every event.
func selection(verb, ids string, all bool) ([]uuid.UUID, error) {
	switch {
	case all && ids != "":
		return nil, cli.Usagef("--id and --all exclude each other")
	case all:
		return nil, nil
	case ids == "":
		return nil, cli.Usagef("%s needs --id ID[,ID...] or --all", verb)
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
