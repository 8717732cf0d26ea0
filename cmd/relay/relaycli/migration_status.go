package relaycli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/migration/bridge"
)

// oldChannelTimeoutDefault bounds status's reads of the old channel: the
// groups' reports and a window of records, which may take longer than a
// database query.
const oldChannelTimeoutDefault = time.Minute

// gateFlags are the shadow gate's settings. `request` decides CUTOVER by
// them and `status` shows the verdict they give, so both register them
// here, with the same names and defaults.
type gateFlags struct {
	maxLateness    *time.Duration
	maxAge         *time.Duration
	maxDeadLetters *int
}

func registerGateFlags(f *cli.Flags) gateFlags {
	return gateFlags{
		maxLateness: f.Duration("max-shadow-lateness", 10*time.Second,
			"shadow gate: the largest p99 delay between an event's two copies a group's report may show"),
		maxAge: f.Duration("report-max-age", 2*time.Minute, "how old a group's newest report (on "+migration.ReportTopic+") may be"),
		maxDeadLetters: f.Int("max-old-dead-letters", 0, "drain before OLD_RETIRED: how many messages a group may leave dead-lettered "+
			"on the old channel, never applied (they go with the old cluster: keep them elsewhere first)"),
	}
}

// check refuses settings no gate can use.
func (g gateFlags) check() error {
	if *g.maxDeadLetters < 0 {
		return cli.Usagef("--max-old-dead-letters %d: want 0 or more", *g.maxDeadLetters)
	}
	return nil
}

// evidence reads the groups' reports from a plan's old channel.
func (g gateFlags) evidence() *migration.ReportEvidence {
	return &migration.ReportEvidence{MaxP99Lateness: *g.maxLateness, MaxAge: *g.maxAge, MaxOldDeadLetters: int64(*g.maxDeadLetters)}
}

// verdict is what ReportEvidence.ShadowGate answers for a group whose newest
// report is r (ok false: none), from the report status already read.
func (g gateFlags) verdict(r migration.Report, ok bool, now time.Time) string {
	switch {
	case !ok:
		return "fails: no report from the group on " + migration.ReportTopic + " (is a worker of it running with the migration's tables?)"
	case now.Sub(r.At) > *g.maxAge:
		return fmt.Sprintf("fails: the report is older than %s", *g.maxAge)
	}
	if err := r.Gate(*g.maxLateness); err != nil {
		return "fails: " + err.Error()
	}
	return "passes"
}

// migrationStatus shows a plan from the database (phase, channels, groups,
// last requests), then what the old channel says: each group's newest
// report with the shadow gate's verdict, and the distinct producers of the
// old channel's topics in a window, which must all be Ferry's or bridged
// before OLD_RETIRED. It exits 1 only when the plan cannot be read: an old
// channel that cannot be reached is said in a line and exits 0, since status
// informs and `request` decides.
func migrationStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var b cli.Base
	f := migrationFlags("status", stderr, &b, "NAME")
	gate := registerGateFlags(f)
	window := f.PositiveDuration("producers-window", migration.ProducersWindowDefault,
		"distinct producers: count the records of the old channel whose timestamp is at most this old")
	topics := f.String("producers-topics", "", "distinct producers: the old channel's topics to read, t1,t2 "+
		"(default: those in which the plan's groups, and the bridge's group "+bridge.GroupPrefix+"<plan>, committed offsets there)")
	oldTimeout := f.PositiveDuration("old-channel-timeout", oldChannelTimeoutDefault,
		"how long the reports and the producers' records may take to read from the old channel")
	if err := parseArgs(f, &b, args, stderr, "NAME"); err != nil {
		return err
	}
	if err := gate.check(); err != nil {
		return err
	}
	dbCtx, cancel := context.WithTimeout(ctx, migrationTimeout)
	defer cancel()
	c, closeDB, err := controller(dbCtx, &b)
	if err != nil {
		return err
	}
	defer closeDB()
	st, err := state(dbCtx, c, f.Arg(0))
	if err != nil {
		return err
	}
	hist, err := c.History(dbCtx, st.Plan.Name)
	if err != nil {
		return err
	}
	if err := planStatus(stdout, st, hist); err != nil {
		return err
	}
	oldCtx, cancelOld := context.WithTimeout(ctx, *oldTimeout)
	defer cancelOld()
	return oldChannelStatus(oldCtx, stdout, st.Plan, oldChannelSettings{gate: gate, window: *window,
		topics: splitList(*topics), timeout: *oldTimeout, retired: st.Phase == migration.OldRetired})
}

// planStatus prints what the database holds of a plan.
func planStatus(stdout io.Writer, st *migration.State, hist []migration.Decision) error {
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "plan\t%s\n", cli.Cell(st.Plan.Name, 100))
	fmt.Fprintf(w, "phase\t%s\n", cli.Cell(string(st.Phase), 20))
	fmt.Fprintf(w, "slices\t%d of %d moved\n", st.Moved(), migration.Slices)
	fmt.Fprintf(w, "epoch\t%d\n", st.Epoch)
	fmt.Fprintf(w, "since\t%s\n", st.Since.Format(timeFormat))
	for _, side := range []struct {
		name string
		ch   migration.Channel
	}{{"old", st.Plan.Old}, {"new", st.Plan.New}} {
		for _, line := range channelLines(side.ch) {
			fmt.Fprintf(w, "%s\t%s\n", side.name, line)
		}
	}
	fmt.Fprintf(w, "groups\t%s\n", cells(st.Plan.Groups))
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nrequests (the last %d of %d):\n", min(lastRequests, len(hist)), len(hist))
	return requestTable(stdout, hist[max(0, len(hist)-lastRequests):])
}

// cells joins names, each escaped.
func cells(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = cli.Cell(n, 100)
	}
	return strings.Join(out, ", ")
}

// channelLines describe a channel, a setting a line. A password shows as
// the name of its variable, which is all a plan holds.
func channelLines(ch migration.Channel) []string {
	if ch.KindOf() == migration.RabbitMQ {
		return rabbitChannelLines(ch)
	}
	lines := []string{
		"brokers " + cli.Cell(strings.Join(ch.Brokers, ","), 200),
		"topic template " + cli.Cell(ch.TopicTemplate, 200),
	}
	tls := "tls off"
	if ch.TLS {
		tls = "tls on"
		for _, file := range []struct{ name, path string }{
			{"ca file", ch.TLSCAFile}, {"client cert", ch.TLSCertFile}, {"client key", ch.TLSKeyFile}} {
			if file.path != "" {
				tls += ", " + file.name + " " + cli.Cell(file.path, 200)
			}
		}
	}
	sasl := "sasl off"
	if ch.SASLMechanism != "" {
		sasl = fmt.Sprintf("sasl %s, user %s, password from $%s", cli.Cell(ch.SASLMechanism, 20),
			cli.Cell(ch.SASLUsername, 100), cli.Cell(ch.SASLPasswordEnv, 100))
	}
	return append(lines, tls, sasl)
}

// rabbitChannelLines describe a RabbitMQ channel.
func rabbitChannelLines(ch migration.Channel) []string {
	lines := []string{
		"rabbitmq url " + cli.Cell(ch.URL, 200),
		"exchange template " + cli.Cell(ch.TopicTemplate, 200) + fmt.Sprintf(", %d shards", ch.Shards),
	}
	tls := "tls off"
	if strings.HasPrefix(ch.URL, "amqps:") {
		tls = "tls on"
	}
	for _, file := range []struct{ name, path string }{
		{"ca file", ch.TLSCAFile}, {"client cert", ch.TLSCertFile}, {"client key", ch.TLSKeyFile}} {
		if file.path != "" {
			tls += ", " + file.name + " " + cli.Cell(file.path, 200)
		}
	}
	password := "no password"
	if ch.PasswordEnv != "" {
		password = "password from $" + cli.Cell(ch.PasswordEnv, 100)
	}
	return append(lines, tls, password)
}

// oldChannelSettings are status's flags for the old channel.
type oldChannelSettings struct {
	gate    gateFlags
	window  time.Duration
	topics  []string
	timeout time.Duration
	retired bool // the plan is in OLD_RETIRED: the shadow gate is behind it
}

// oldChannelStatus prints the groups' reports and the old channel's
// producers. What it cannot read it says, and returns nil: only a failure
// to write the output is an error.
func oldChannelStatus(ctx context.Context, stdout io.Writer, p migration.Plan, s oldChannelSettings) error {
	fmt.Fprintf(stdout, "\nold channel %s (read within %s, --old-channel-timeout):\n", cli.Cell(p.Old.Where(), 200), s.timeout)
	if err := pingOld(ctx, p); err != nil {
		fmt.Fprintf(stdout, "old channel not reached: %s\nthe groups' reports and the old channel's producers are not shown; "+
			"the plan above is the database's\n", oldChannelError(err, s.timeout))
		return nil
	}
	reports, err := s.gate.evidence().Reports(ctx, p)
	if err != nil {
		fmt.Fprintf(stdout, "reports not read: %s\n", oldChannelError(err, s.timeout))
	} else if err := reportTable(stdout, p, reports, s.gate, s.retired, time.Now()); err != nil {
		return err
	}
	if err := lagTable(ctx, stdout, p, reports); err != nil {
		return err
	}
	if p.Old.KindOf() == migration.RabbitMQ {
		seen, err := s.gate.evidence().SeenProducers(ctx, p, s.window)
		if err != nil {
			fmt.Fprintf(stdout, "\nproducers not read: %s\n", oldChannelError(err, s.timeout))
			return nil
		}
		return seenProducersTable(stdout, seen, s.window)
	}
	groups := append(slices.Clone(p.Groups), bridge.GroupPrefix+p.Name)
	res, err := migration.Producers(ctx, p, &migration.ProducersOpts{Topics: s.topics, Groups: groups, Window: s.window})
	if err != nil {
		fmt.Fprintf(stdout, "\nproducers not read: %s\n", oldChannelError(err, s.timeout))
		return nil
	}
	return producerTables(stdout, res, s.window)
}

// oldChannelError is err as status shows it: escaped (it may repeat the
// plan's broker addresses), and saying which flag bounds the wait.
func oldChannelError(err error, timeout time.Duration) string {
	msg := cli.Cell(err.Error(), 500)
	if errors.Is(err, context.DeadlineExceeded) {
		msg = fmt.Sprintf("no answer within %s (--old-channel-timeout): %s", timeout, msg)
	}
	return msg
}

// pingOld says whether the old channel answers, so that an unreachable one
// costs one wait and one line rather than one per reading.
func pingOld(ctx context.Context, p migration.Plan) error { return p.Old.Ping(ctx, "old", nil) }

// reportTable prints each group's newest report and the shadow gate's
// verdict on it: the plan's groups in its order, then any other group that
// reported on the plan. Once the plan is retired the gate is behind it: the
// reports speak of copies of the new channel alone, which no gate judges.
func reportTable(stdout io.Writer, p migration.Plan, reports map[string]migration.Report, gate gateFlags, retired bool, now time.Time) error {
	fmt.Fprintf(stdout, "\nreports on %s, the newest of each group (shadow gate: p99 at most %s, --max-shadow-lateness; "+
		"a report at most %s old, --report-max-age):\n", migration.ReportTopic, *gate.maxLateness, *gate.maxAge)
	groups := slices.Clone(p.Groups)
	var others []string
	for g := range reports {
		if !slices.Contains(groups, g) {
			others = append(others, g)
		}
	}
	slices.Sort(others)
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tAGE\tAUTHORITATIVE\tSHADOW\tCHECKED\tMISSING\tMISMATCHED\tP99\tMAX\tDUPLICATES_OLD\tDUPLICATES_NEW\tOLD_FENCE_EPOCH\tQUARANTINED\tOLD_DEAD_LETTERS\tSHADOW_GATE")
	for _, g := range append(groups, others...) {
		r, ok := reports[g]
		verdict := gate.verdict(r, ok, now)
		switch {
		case !slices.Contains(p.Groups, g):
			verdict = "not a group of the plan"
		case retired:
			verdict = "not needed: the old channel is retired"
		}
		if !ok {
			fmt.Fprintf(w, "%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%s\n", cli.Cell(g, 100), cli.Cell(verdict, 300))
			continue
		}
		deadLetters := strconv.FormatInt(r.OldDeadLetters, 10)
		if r.OldDeadLetters < 0 {
			deadLetters = "?"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", cli.Cell(g, 100), now.Sub(r.At).Round(time.Second),
			r.Authoritative, r.Shadow, r.Checked, r.Missing, r.Mismatched, delay(r.P99Lateness), delay(r.MaxLateness),
			r.DuplicatesOld, r.DuplicatesNew, r.OldFenceEpoch, r.Quarantined, deadLetters, cli.Cell(verdict, 600))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if p.Old.KindOf() != migration.RabbitMQ {
		return nil
	}
	// What the drain of a RabbitMQ old channel waits for besides the fences.
	for _, g := range groups {
		r, ok := reports[g]
		switch {
		case !ok:
		case r.OldWorkedAt.IsZero():
			fmt.Fprintf(stdout, "%s: nothing to apply from the old channel since its worker started (the drain wants %s of quiet)\n",
				cli.Cell(g, 100), r.OldQuiet)
		default:
			fmt.Fprintf(stdout, "%s: last took a message to apply from the old channel %s before its report (the drain wants %s of quiet)\n",
				cli.Cell(g, 100), r.At.Sub(r.OldWorkedAt).Round(time.Millisecond), r.OldQuiet)
		}
	}
	return nil
}

// lagTable prints each group's lag on each channel: the records of the
// topics the channel's template names that the group has not committed
// yet; on RabbitMQ, what its shard queues hold and its worker has not
// finished, from the group's newest report. A channel that cannot be read
// is said in a line.
func lagTable(ctx context.Context, stdout io.Writer, p migration.Plan, reports map[string]migration.Report) error {
	fmt.Fprintf(stdout, "\nlag of the groups (records not committed yet, in the topics each channel's template names):\n")
	lags := map[string][2]string{}
	for i, side := range []struct {
		name string
		ch   migration.Channel
	}{{"old", p.Old}, {"new", p.New}} {
		var got map[string]int64
		var err error
		rabbit := side.ch.KindOf() == migration.RabbitMQ
		if rabbit {
			got, err = reportedLags(reports, side.name, p.Groups)
		} else {
			got, err = channelLags(ctx, side.name, side.ch, p.Groups)
		}
		for _, g := range p.Groups {
			l := lags[g]
			lag, reported := got[g]
			switch {
			case rabbit && !reported, !rabbit && err != nil:
				l[i] = "?"
			default:
				l[i] = strconv.FormatInt(lag, 10) // on Kafka, a group with no offset there lags by nothing
			}
			lags[g] = l
		}
		if err != nil {
			fmt.Fprintf(stdout, "%s channel not read: %s\n", side.name, cli.Cell(err.Error(), 500))
		}
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tOLD_LAG\tNEW_LAG")
	for _, g := range p.Groups {
		fmt.Fprintf(w, "%s\t%s\t%s\n", cli.Cell(g, 100), lags[g][0], lags[g][1])
	}
	return w.Flush()
}

// reportedLags are the groups' lags on a RabbitMQ channel of the plan as
// their newest reports give them (AMQP cannot list the topics a group
// consumes); a group whose report has none is missing.
func reportedLags(reports map[string]migration.Report, side string, groups []string) (map[string]int64, error) {
	out := map[string]int64{}
	var none []string
	for _, g := range groups {
		lag := reports[g].OldLag
		if side == "new" {
			lag = reports[g].NewLag
		}
		if lag == nil {
			none = append(none, g)
			continue
		}
		out[g] = *lag
	}
	if len(none) > 0 {
		return out, fmt.Errorf("no report of %s gives its lag on RabbitMQ yet (its worker reads its shard queues every few seconds; "+
			"worker status --rabbitmq-url shows each one)", strings.Join(none, ", "))
	}
	return out, nil
}

// channelLags sums each group's lag over the topics Kafka channel ch names.
func channelLags(ctx context.Context, side string, ch migration.Channel, groups []string) (map[string]int64, error) {
	opts, err := ch.KafkaOpts(side, nil)
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	// A coordinator not available yet (a fresh cluster creates its offsets
	// topic on the first group request) is asked again until ctx ends.
	var lags kadm.DescribedGroupLags
	for retry := (backoff.Sequence{Base: 100 * time.Millisecond, Ceiling: time.Second}); ; {
		lags, err = kadm.NewClient(cl).Lag(ctx, groups...)
		if err == nil {
			for _, l := range lags {
				if e := errors.Join(l.DescribeErr, l.FetchErr); kerr.IsRetriable(e) {
					err = e
				}
			}
		}
		if err == nil || !kerr.IsRetriable(err) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(retry.Next()):
		}
	}
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, g := range groups {
		l, ok := lags[g]
		if !ok {
			continue
		}
		err := errors.Join(l.DescribeErr, l.FetchErr)
		if errors.Is(err, kerr.GroupIDNotFound) {
			continue // nothing committed on this channel yet
		}
		if err != nil {
			return nil, fmt.Errorf("group %s: %w", g, err)
		}
		for topic, tl := range l.Lag.TotalByTopic() {
			if ch.Names(topic) {
				out[g] += tl.Lag
			}
		}
	}
	return out, nil
}

// delay rounds a delay between copies to what an operator reads.
func delay(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return d.Round(time.Microsecond)
	}
	return d.Round(time.Millisecond)
}

// seenProducersTable prints the producers the groups saw on a RabbitMQ old
// channel, by the user id the broker validated, and what to do with them.
func seenProducersTable(stdout io.Writer, seen []migration.ProducerSeen, window time.Duration) error {
	fmt.Fprintf(stdout, "\nproducers on the old channel the groups consumed from in the last %s (--producers-window; "+
		"the report stream keeps a day), by the user RabbitMQ validated:\n", window)
	if len(seen) == 0 {
		_, err := fmt.Fprintln(stdout, "none reported yet (a worker of a group reports what it consumed once it follows the plan)")
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TOPIC\tUSER\tRECORDS\tLAST_SEEN")
	for _, ps := range seen {
		user := cli.Cell(ps.User, 100)
		if ps.User == "" {
			user = "(none)"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\n", cli.Cell(ps.Topic, 200), user, ps.Records, ps.Last.Format(timeFormat))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprint(stdout, "\nThe user is the one the publishing connection logged in as: the broker refuses a message whose user id is another. "+
		"(none) published without a user id, which nothing validates.\nA user that is not the relay's must move to the new channel "+
		"before OLD_RETIRED.\n")
	return err
}

// producerTables print the old channel's distinct producers per topic,
// then each producer, and what to do with them.
func producerTables(stdout io.Writer, res *migration.ProducersResult, window time.Duration) error {
	from := "--producers-topics"
	if res.Groups != nil {
		from = "the topics in which " + cells(res.Groups) + " committed offsets on the old channel"
	}
	fmt.Fprintf(stdout, "\nproducers on the old channel, records from %s to %s (the last %s, --producers-window), in %s:\n",
		res.Since.Format(timeFormat), res.Until.Format(timeFormat), window, from)
	if len(res.Topics) == 0 {
		fmt.Fprintln(stdout, "no topic to read: name the old channel's topics with --producers-topics")
		return nil
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TOPIC\tDISTINCT_PRODUCERS\tUNKNOWN_PRODUCERS\tRECORDS")
	for _, t := range res.Topics {
		if t.Missing {
			fmt.Fprintf(w, "%s\t-\t-\t- (no such topic)\n", cli.Cell(t.Topic, 200))
			continue
		}
		unknown := "no"
		if t.Unknown.Records > 0 {
			unknown = "yes"
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%d\n", cli.Cell(t.Topic, 200), len(t.Producers), unknown, t.Records)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	w = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TOPIC\tPRODUCER_ID\tRECORDS\tSTAMPED\tFIRST_SEEN\tLAST_SEEN")
	for _, t := range res.Topics {
		prs := t.Producers
		if t.Unknown.Records > 0 {
			prs = append(slices.Clone(prs), t.Unknown)
		}
		for _, pr := range prs {
			id := strconv.FormatInt(pr.ID, 10)
			if pr.ID == migration.UnknownProducer {
				id = "unknown"
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\n", cli.Cell(t.Topic, 200), id, pr.Records, pr.Stamped,
				pr.FirstSeen.Format(timeFormat), pr.LastSeen.Format(timeFormat))
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprint(stdout, "\nA producer id is one producer session: a producer that restarted shows once per run. "+
		"Unknown producers wrote without idempotence,\nso their records carry no id: one producer or more. "+
		"STAMPED counts records with Ferry's route stamp or fence: a Ferry relay writing both channels.\n"+
		"A producer not known to be Ferry's relay or the bridge must move to the new channel (or be bridged: "+
		"relay bridge) before OLD_RETIRED.\n")
	return err
}
