package workercli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/cli"
)

func runStatus(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags(name+" status", stderr)
	var base cli.Base
	base.Register(f)
	var kafka cli.Kafka
	kafka.Register(f, "ferry-worker-status")
	var rabbit cli.RabbitMQ
	rabbit.Register(f, "ferry-worker-status")
	topics := f.String("topics", "", "RabbitMQ: comma-separated topics the consumers consume (their shard queues are named after them); required with --rabbitmq-url")
	consumers := f.String("consumers", "", "comma-separated consumers (consumer group names) to describe; required")
	timeout := f.FlagSet.Duration("timeout", 30*time.Second, "give up after this long")
	if _, err := base.Parse(f, args, stderr); err != nil {
		return err
	}
	names := splitList(*consumers)
	if len(names) == 0 {
		return cli.Usagef("--consumers is required: the consumers to describe, such as stock.reservation,order.status")
	}
	var kopts []kgo.Opt
	if rabbit.Enabled() {
		if err := rabbit.Validate(); err != nil {
			return err
		}
		if len(splitList(*topics)) == 0 {
			return cli.Usagef("--topics is required with --rabbitmq-url: the consumers' topics, such as outbox.event.order")
		}
	} else {
		var err error
		if kopts, err = kafka.Opts(nil); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	pool, err := base.DB.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var sts []inbox.ConsumerStatus
	if rabbit.Enabled() {
		sts, err = inbox.RabbitMQStatus(ctx, pool, rabbitConnection(&rabbit), splitList(*topics), names...)
	} else {
		sts, err = inbox.Status(ctx, pool, kopts, names...)
	}
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	group := "GROUP"
	if rabbit.Enabled() {
		group = "QUEUES"
	}
	fmt.Fprintln(w, "CONSUMER\t"+group+"\tMEMBERS\tLAG\tINBOX ROWS\tNEWEST APPLIED")
	for _, st := range sts {
		newest := "-"
		if !st.NewestApplied.IsZero() {
			newest = st.NewestApplied.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d\t%s\n", st.Consumer, orDash(st.GroupState), st.Members, lagText(st), st.InboxMessages, newest)
	}
	return w.Flush()
}

// lagText is the total lag with its topics: "12 (orders 10, stock 2)".
func lagText(st inbox.ConsumerStatus) string {
	if len(st.Lag) == 0 {
		return "-"
	}
	topics := make([]string, 0, len(st.Lag))
	for t := range st.Lag {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	parts := make([]string, len(topics))
	for i, t := range topics {
		parts[i] = fmt.Sprintf("%s %d", t, st.Lag[t])
	}
	return fmt.Sprintf("%d (%s)", st.TotalLag(), strings.Join(parts, ", "))
}
