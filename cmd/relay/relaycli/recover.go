package relaycli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/relay"
)

func runRecover(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags("relay recover", stderr)
	var e engine
	e.register(f)
	e.rabbit = &rabbitFlags{} // the gap goes to the channel `relay run` publishes to
	e.rabbit.register(f)
	margin := f.PositiveDuration("recover-margin", relay.RecoverMarginDefault, "republish from this long before the last confirmed commit time")
	var since cli.TimeValue
	f.FlagSet.Var(&since, "since", "republish outbox rows created at or after this RFC 3339 time or duration ago (7d); needed when Ferry has no record of the slot")
	force := f.FlagSet.Bool("force", false, "republish even when rows of the window may have been deleted: no outbox row is older than it (on a database younger than it, none older than the last confirmed commit)")
	_, cfg, err := e.parse(ctx, f, args, stderr)
	if err != nil {
		return err
	}
	defer e.close()
	r, err := relay.New(cfg)
	if err != nil {
		return cli.ConfigError(err, configFlags)
	}
	res, err := r.Recover(ctx, &relay.RecoverOpts{Margin: *margin, Since: since.T, Force: *force})
	if res != nil && res.SlotLSN != "" {
		fmt.Fprintf(stdout, "slot %s: old slot %s; new slot at %s\n", cfg.Slot, res.Replaced, res.SlotLSN)
		fmt.Fprintf(stdout, "republished %d outbox events created since %s; %d quarantined\n",
			res.Republished, res.Since.UTC().Format(time.RFC3339Nano), res.Quarantined)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "recovered: `relay run` streams on from the new slot")
	return nil
}
