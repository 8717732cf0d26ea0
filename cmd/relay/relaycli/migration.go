package relaycli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/internal/kafkaauth"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/internal/topicname"
	"github.com/ferryhq/ferry/migration"
)

// migrationVerbs are the subcommands of `relay migration`.
var migrationVerbs = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"create":  migrationCreate,
	"list":    migrationList,
	"status":  migrationStatus,
	"request": migrationRequest,
	"history": migrationHistory,
}

// migrationTimeout bounds one command: a request may wait for the lock a
// relay holds while it creates its slot, but never forever.
const migrationTimeout = 30 * time.Second

// timeFormat is how the tables show a time, as `relay quarantine list` does.
const timeFormat = "2006-01-02 15:04:05Z07:00"

// lastRequests is how many requests `relay migration status` shows.
const lastRequests = 5

const migrationUsage = `Usage:
  relay migration create NAME --old-brokers H:P --old-topic-template T
                   --new-brokers H:P --new-topic-template T --groups G[,G...]
  relay migration create NAME --old-kind rabbitmq --old-url amqp://U@H:P/V
                   --old-password-env VAR --old-topic-template T ...
  relay migration list
  relay migration status NAME
  relay migration request NAME PHASE [--slices K]
  relay migration history NAME

A live broker migration plan moves the outbox's events from an old channel
to a new one, each Kafka or RabbitMQ (--old-kind, --new-kind), through OLD_ONLY, DUAL_WRITE, CUTOVER and
OLD_RETIRED; every request is recorded, accepted or rejected.
"relay migration VERB -h" lists the flags of a verb.
`

func runMigration(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && cli.IsHelp(args[0]) {
		fmt.Fprint(stdout, migrationUsage)
		return nil
	}
	if len(args) == 0 || migrationVerbs[args[0]] == nil {
		return cli.Usagef("want `relay migration create NAME ...`, `list`, `status NAME`, `request NAME PHASE [--slices K]` " +
			"or `history NAME` (`relay migration VERB -h` lists its flags)")
	}
	if args[0] != "status" { // status bounds its reads itself: the database by migrationTimeout, the old channel by a flag
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, migrationTimeout)
		defer cancel()
	}
	return migrationVerbs[args[0]](ctx, args[1:], stdout, stderr)
}

// migrationFlags starts the flag set of `relay migration verb`, which takes
// exactly the arguments named in args ("NAME", "PHASE").
func migrationFlags(verb string, stderr io.Writer, b *cli.Base, args ...string) *cli.Flags {
	f := cli.NewFlags("relay migration "+verb, stderr)
	b.Register(f)
	f.TakesArgs(len(args))
	return f
}

// parseArgs parses the command line and checks that every argument named
// in want is there.
func parseArgs(f *cli.Flags, b *cli.Base, args []string, stderr io.Writer, want ...string) error {
	if _, err := b.Parse(f, args, stderr); err != nil {
		return err
	}
	if f.NArg() < len(want) {
		return cli.Usagef("%s needs %s", f.Name(), strings.Join(want, " "))
	}
	return nil
}

// controller opens the database and the controller on it, and returns
// what closes the database.
func controller(ctx context.Context, b *cli.Base) (*migration.Controller, func(), error) {
	pool, err := b.DB.Pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	// Evidence: read by the requests that need it (migrationRequest).
	return &migration.Controller{DB: pool}, pool.Close, nil
}

// byFlag registers --by, who asks, recorded with what it asks.
func byFlag(f *cli.Flags) *string {
	return f.FlagSet.String("by", whoami(), "who asks, recorded with the request")
}

// checkBy refuses an empty --by.
func checkBy(by string) error {
	if strings.TrimSpace(by) == "" {
		return cli.Usagef("--by is empty: name who asks (it defaults to user@host)")
	}
	return nil
}

// whoami is the default of --by: "user@host", never empty.
func whoami() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = "uid" + strconv.Itoa(os.Getuid())
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		return name + "@" + host
	}
	return name
}

// channelFlags are the --old-* or --new-* settings of `relay migration
// create`: one channel, Kafka or RabbitMQ. They are registered on the
// FlagSet itself, so no FERRY_* variable sets them: they belong to one
// plan, not to a binary.
type channelFlags struct {
	side            string // "old" or "new"
	fs              *flag.FlagSet
	kind            string
	brokers         string
	topicTemplate   string
	tls             bool
	tlsCAFile       string
	tlsCertFile     string
	tlsKeyFile      string
	saslMechanism   string
	saslUsername    string
	saslPasswordEnv string
	url             string
	passwordEnv     string
	shards          int
}

func (c *channelFlags) register(f *cli.Flags, side string) {
	c.side, c.fs = side, f.FlagSet
	fs := f.FlagSet
	fs.StringVar(&c.kind, side+"-kind", string(migration.Kafka), "the "+side+" channel's broker: kafka or rabbitmq")
	fs.StringVar(&c.brokers, side+"-brokers", "", "Kafka: the "+side+" channel's seed brokers, host:port[,host:port] (required)")
	fs.StringVar(&c.topicTemplate, side+"-topic-template", "", "the "+side+" channel's topic template, such as outbox.event.{aggregate_type} "+
		"(on RabbitMQ, the exchange's) (required)")
	fs.BoolVar(&c.tls, side+"-tls", false, "Kafka: reach the "+side+" channel with TLS")
	fs.StringVar(&c.tlsCAFile, side+"-tls-ca-file", "", "PEM file of CAs that sign the "+side+" brokers' certificates, on the relay's host")
	fs.StringVar(&c.tlsCertFile, side+"-tls-cert-file", "", "PEM client certificate for mutual TLS with the "+side+" channel")
	fs.StringVar(&c.tlsKeyFile, side+"-tls-key-file", "", "PEM client key for mutual TLS with the "+side+" channel")
	fs.StringVar(&c.saslMechanism, side+"-sasl-mechanism", "", "Kafka: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	fs.StringVar(&c.saslUsername, side+"-sasl-username", "", "Kafka: SASL user on the "+side+" channel")
	fs.StringVar(&c.saslPasswordEnv, side+"-sasl-password-env", "", "Kafka: the NAME of the environment variable holding the "+
		side+" channel's SASL password wherever the plan is used; the password itself is never given nor stored")
	fs.StringVar(&c.url, side+"-url", "", "RabbitMQ: the "+side+" channel's amqp://user@host:5672/vhost or amqps://... (TLS), "+
		"without a password (required)")
	fs.StringVar(&c.passwordEnv, side+"-password-env", "", "RabbitMQ: the NAME of the environment variable holding the "+
		side+" channel's password wherever the plan is used; the password itself is never given nor stored")
	fs.IntVar(&c.shards, side+"-shards", rabbitmq.ShardsDefault, "RabbitMQ: the "+side+" channel's shards per topic, "+
		"its relay's and workers' --rabbitmq-shards")
}

// envName is a variable name, as migration.Plan wants for a password
// variable. Checked here too, so that a password given by mistake is
// refused by flag without being repeated.
var envName = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)

// flag is the name of one of the channel's flags.
func (c *channelFlags) flag(name string) string { return "--" + c.side + "-" + name }

// channel checks the settings by flag name and returns the channel.
func (c *channelFlags) channel() (migration.Channel, error) {
	ch := migration.Channel{TopicTemplate: c.topicTemplate,
		TLSCAFile: c.tlsCAFile, TLSCertFile: c.tlsCertFile, TLSKeyFile: c.tlsKeyFile}
	if ch.TopicTemplate == "" {
		return ch, cli.Usagef("%s is required", c.flag("topic-template"))
	}
	// The check relay.Config.TopicTemplate and migration.Plan make.
	if err := topicname.CheckTemplate(ch.TopicTemplate); err != nil {
		return ch, cli.Usagef("%s %w", c.flag("topic-template"), err)
	}
	if (ch.TLSCertFile == "") != (ch.TLSKeyFile == "") {
		return ch, cli.Usagef("%s and %s go together", c.flag("tls-cert-file"), c.flag("tls-key-file"))
	}
	switch migration.Kind(strings.ToLower(c.kind)) {
	case migration.Kafka:
		return c.kafka(ch)
	case migration.RabbitMQ:
		return c.rabbitMQ(ch)
	}
	return ch, cli.Usagef("%s %q: want kafka or rabbitmq", c.flag("kind"), c.kind)
}

// given are those of names whose flags were set.
func given(f *flag.FlagSet, names ...string) []string {
	var out []string
	f.Visit(func(fl *flag.Flag) {
		if slices.Contains(names, fl.Name) {
			out = append(out, "--"+fl.Name)
		}
	})
	return out
}

// kafka completes a Kafka channel.
func (c *channelFlags) kafka(ch migration.Channel) (migration.Channel, error) {
	ch.Brokers, ch.TLS = splitList(c.brokers), c.tls
	ch.SASLMechanism, ch.SASLUsername, ch.SASLPasswordEnv = strings.ToUpper(c.saslMechanism), c.saslUsername, c.saslPasswordEnv
	if wrong := given(c.fs, c.side+"-url", c.side+"-password-env", c.side+"-shards"); len(wrong) > 0 {
		return ch, cli.Usagef("%s: RabbitMQ settings, and the %s channel is Kafka (%s rabbitmq?)",
			strings.Join(wrong, ", "), c.side, c.flag("kind"))
	}
	if len(ch.Brokers) == 0 {
		return ch, cli.Usagef("%s is required: host:port[,host:port]", c.flag("brokers"))
	}
	for _, b := range ch.Brokers {
		if !strings.Contains(b, ":") {
			return ch, cli.Usagef("%s: %q is not host:port", c.flag("brokers"), b)
		}
	}
	if !ch.TLS && (ch.TLSCAFile != "" || ch.TLSCertFile != "" || ch.TLSKeyFile != "") {
		return ch, cli.Usagef("%s settings need %s", c.flag("tls-*"), c.flag("tls"))
	}
	switch ch.SASLMechanism {
	case "":
		if ch.SASLUsername != "" || ch.SASLPasswordEnv != "" {
			return ch, cli.Usagef("%s and %s need %s", c.flag("sasl-username"), c.flag("sasl-password-env"), c.flag("sasl-mechanism"))
		}
		return ch, nil
	case cli.SASLPlain, cli.SASLScramSHA256, cli.SASLScramSHA512:
	default:
		return ch, cli.Usagef("%s %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", c.flag("sasl-mechanism"), c.saslMechanism)
	}
	switch {
	case ch.SASLUsername == "":
		return ch, cli.Usagef("%s %s needs %s", c.flag("sasl-mechanism"), ch.SASLMechanism, c.flag("sasl-username"))
	case ch.SASLPasswordEnv == "":
		return ch, cli.Usagef("%s %s needs %s: the name of the environment variable that holds the password",
			c.flag("sasl-mechanism"), ch.SASLMechanism, c.flag("sasl-password-env"))
	}
	return ch, c.checkEnvName("sasl-password-env", ch.SASLPasswordEnv)
}

// rabbitMQ completes a RabbitMQ channel.
func (c *channelFlags) rabbitMQ(ch migration.Channel) (migration.Channel, error) {
	ch.Kind, ch.URL, ch.PasswordEnv, ch.Shards = migration.RabbitMQ, c.url, c.passwordEnv, c.shards
	kafkaOnly := []string{c.side + "-brokers", c.side + "-tls", c.side + "-sasl-mechanism", c.side + "-sasl-username", c.side + "-sasl-password-env"}
	if wrong := given(c.fs, kafkaOnly...); len(wrong) > 0 {
		return ch, cli.Usagef("%s: Kafka settings, and the %s channel is RabbitMQ (which uses TLS when %s is amqps://)",
			strings.Join(wrong, ", "), c.side, c.flag("url"))
	}
	if ch.URL == "" {
		return ch, cli.Usagef("%s is required: amqp://user@host:5672/vhost or amqps://...", c.flag("url"))
	}
	conn := rabbitmq.Conn{URL: ch.URL, TLS: kafkaauth.TLSFiles{CA: ch.TLSCAFile, Cert: ch.TLSCertFile, Key: ch.TLSKeyFile}}
	names := rabbitmq.Names{URL: c.flag("url"), Password: c.flag("password-env"), Vhost: c.flag("url") + "'s vhost",
		CA: c.flag("tls-ca-file"), CertKey: c.flag("tls-cert-file") + " and " + c.flag("tls-key-file")}
	if err := conn.Check(names); err != nil {
		return ch, cli.Usagef("%s", err)
	}
	if err := rabbitmq.CheckShards(ch.Shards); err != nil {
		return ch, cli.Usagef("%s: %s", c.flag("shards"), err)
	}
	if ch.PasswordEnv == "" {
		return ch, nil
	}
	return ch, c.checkEnvName("password-env", ch.PasswordEnv)
}

// checkEnvName refuses a value of a --*-password-env flag that is not the
// name of a variable, without repeating it: it may be the password itself.
func (c *channelFlags) checkEnvName(name, value string) error {
	if envName.MatchString(value) {
		return nil
	}
	return cli.Usagef("%s takes the NAME of an environment variable (A-Z, 0-9, _, such as FERRY_%s_PASSWORD), "+
		"never the password; the value given is not one", c.flag(name), strings.ToUpper(c.side))
}

// splitList splits a comma-separated list, leaving out empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

func migrationCreate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var b cli.Base
	f := migrationFlags("create", stderr, &b, "NAME")
	var old, nw channelFlags
	old.register(f, "old")
	nw.register(f, "new")
	groups := f.FlagSet.String("groups", "", "the consumer groups that must follow, g1,g2 (required)")
	by := byFlag(f)
	if err := parseArgs(f, &b, args, stderr, "NAME"); err != nil {
		return err
	}
	p := migration.Plan{Name: f.Arg(0), Groups: splitList(*groups)}
	var err error
	if p.Old, err = old.channel(); err != nil {
		return err
	}
	if p.New, err = nw.channel(); err != nil {
		return err
	}
	if len(p.Groups) == 0 {
		return cli.Usagef("--groups is required: the consumer groups that must follow, g1,g2")
	}
	if err := checkBy(*by); err != nil {
		return err
	}
	target, err := b.DB.Target()
	if err != nil {
		return err
	}
	c, closeDB, err := controller(ctx, &b)
	if err != nil {
		return err
	}
	defer closeDB()
	fmt.Fprintln(stdout, target)
	if err := c.Create(ctx, p, *by); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "created plan %s in %s (epoch 0), by %s\nnext: relay migration request %s %s\n",
		p.Name, migration.OldOnly, cli.Cell(*by, 100), p.Name, migration.DualWrite)
	old.warnUnsetPassword(stderr, p.Name)
	nw.warnUnsetPassword(stderr, p.Name)
	return nil
}

// warnUnsetPassword warns when the channel's SASL password variable is not
// set here. The plan holds only its name and the processes that follow the
// plan read it, on their hosts, so this is no error; but an unset variable
// where the plan is made is most often a typo in its name.
func (c *channelFlags) warnUnsetPassword(stderr io.Writer, plan string) {
	name, env := "sasl-password-env", c.saslPasswordEnv
	if c.passwordEnv != "" {
		name, env = "password-env", c.passwordEnv
	}
	if env == "" || os.Getenv(env) != "" {
		return
	}
	fmt.Fprintf(stderr, "warning: %s: %s is not set here; every relay, worker and bridge that follows plan %s "+
		"reads the %s channel's password from it, and cannot reach that channel without it (a typo in the name?)\n",
		c.flag(name), env, plan, c.side)
}

func migrationList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var b cli.Base
	f := migrationFlags("list", stderr, &b)
	if err := parseArgs(f, &b, args, stderr); err != nil {
		return err
	}
	c, closeDB, err := controller(ctx, &b)
	if err != nil {
		return err
	}
	defer closeDB()
	plans, err := c.List(ctx)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tPHASE\tSLICES\tEPOCH\tSINCE")
	for _, st := range plans {
		fmt.Fprintf(w, "%s\t%s\t%d/%d\t%d\t%s\n", cli.Cell(st.Plan.Name, 100), cli.Cell(string(st.Phase), 20),
			st.Moved(), migration.Slices, st.Epoch, st.Since.Format(timeFormat))
	}
	return w.Flush()
}

func migrationRequest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var b cli.Base
	f := migrationFlags("request", stderr, &b, "NAME", "PHASE")
	// Any number: what a phase takes is the controller's to decide, and its
	// refusal is recorded.
	slices := f.FlagSet.Int("slices", 0, "slices moved to the new channel, for "+string(migration.Cutover)+" (1 to 128)")
	gate := registerGateFlags(f)
	by := byFlag(f)
	if err := parseArgs(f, &b, args, stderr, "NAME", "PHASE"); err != nil {
		return err
	}
	to, err := migration.ParsePhase(strings.ToUpper(f.Arg(1)))
	if err != nil {
		return cli.Usagef("PHASE %q: want %s, %s, %s or %s", f.Arg(1),
			migration.OldOnly, migration.DualWrite, migration.Cutover, migration.OldRetired)
	}
	if err := checkBy(*by); err != nil {
		return err
	}
	if err := gate.check(); err != nil {
		return err
	}
	target, err := b.DB.Target()
	if err != nil {
		return err
	}
	c, closeDB, err := controller(ctx, &b)
	if err != nil {
		return err
	}
	defer closeDB()
	// The consumer groups' reports, on the plan's old channel, decide the
	// shadow gate (CUTOVER) and the drain (OLD_RETIRED).
	c.Evidence = gate.evidence()
	fmt.Fprintln(stdout, target)
	d, err := c.Request(ctx, f.Arg(0), to, *slices, *by)
	if errors.Is(err, migration.ErrNotFound) {
		return fmt.Errorf("%w (`relay migration list` shows the plans)", err)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "request %d: %s -> %s, by %s\n", d.ID, phaseText(d.From, d.FromSlices), phaseText(d.To, d.ToSlices), cli.Cell(d.By, 100))
	reason := cli.Cell(d.Reason, 500)
	if !d.Accepted {
		fmt.Fprintf(stdout, "rejected (epoch %d unchanged): %s\n", d.Epoch, reason)
		// A rejection is recorded, not a failure to decide; it still exits
		// 1 so that a script goes no further.
		return fmt.Errorf("request %d rejected: %s", d.ID, reason)
	}
	fmt.Fprintf(stdout, "accepted, epoch %d: %s\n", d.Epoch, reason)
	return nil
}

func migrationHistory(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var b cli.Base
	f := migrationFlags("history", stderr, &b, "NAME")
	if err := parseArgs(f, &b, args, stderr, "NAME"); err != nil {
		return err
	}
	c, closeDB, err := controller(ctx, &b)
	if err != nil {
		return err
	}
	defer closeDB()
	// History of an unknown name is empty: say the plan is unknown instead.
	st, err := state(ctx, c, f.Arg(0))
	if err != nil {
		return err
	}
	hist, err := c.History(ctx, st.Plan.Name)
	if err != nil {
		return err
	}
	return requestTable(stdout, hist)
}

// state reads the plan name, pointing at `list` when there is none.
func state(ctx context.Context, c *migration.Controller, name string) (*migration.State, error) {
	st, err := c.State(ctx, name)
	if errors.Is(err, migration.ErrNotFound) {
		return nil, fmt.Errorf("%w (`relay migration list` shows the plans)", err)
	}
	return st, err
}

// requestTable prints recorded requests, oldest first. Who asked and why
// the controller decided as it did (a consumer group's report, in time) are
// escaped.
func requestTable(stdout io.Writer, hist []migration.Decision) error {
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tAT\tBY\tFROM\tTO\tDECISION\tREASON")
	for _, d := range hist {
		decision := "rejected"
		if d.Accepted {
			decision = "accepted"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", d.ID, d.At.Format(timeFormat), cli.Cell(d.By, 100),
			phaseText(d.From, d.FromSlices), phaseText(d.To, d.ToSlices), decision, cli.Cell(d.Reason, 500))
	}
	return w.Flush()
}

// phaseText is a phase with its slices where they matter: "CUTOVER 6/128";
// slices asked of another phase show too, since they are why it was refused.
func phaseText(p migration.Phase, slices int) string {
	s := cli.Cell(string(p), 20)
	if p == migration.Cutover || slices != 0 {
		s += fmt.Sprintf(" %d/%d", slices, migration.Slices)
	}
	return s
}
