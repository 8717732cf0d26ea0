package migration

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/internal/topicname"
)

// Kind is the kind of broker a channel is.
type Kind string

// The kinds of channel. A Channel whose Kind is empty is Kafka: plans
// recorded before channels had a kind keep their meaning.
const (
	Kafka    Kind = "kafka"
	RabbitMQ Kind = "rabbitmq"
)

// Channel is one side of a migration: a Kafka cluster or a RabbitMQ
// broker, and the topic template the relay fills ({aggregate_type},
// {event_type}); on RabbitMQ each topic is an exchange. No password is
// ever stored: SASLPasswordEnv (Kafka) or PasswordEnv (RabbitMQ) names the
// environment variable that holds it wherever the channel is used, and a
// fence carries the channel as it is here.
type Channel struct {
	Kind Kind `json:"kind,omitempty"` // Kafka when empty

	// Kafka.
	Brokers         []string `json:"brokers,omitempty"`
	TopicTemplate   string   `json:"topic_template"`
	TLS             bool     `json:"tls,omitempty"`
	TLSCAFile       string   `json:"tls_ca_file,omitempty"`
	TLSCertFile     string   `json:"tls_cert_file,omitempty"`
	TLSKeyFile      string   `json:"tls_key_file,omitempty"`
	SASLMechanism   string   `json:"sasl_mechanism,omitempty"` // PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
	SASLUsername    string   `json:"sasl_username,omitempty"`
	SASLPasswordEnv string   `json:"sasl_password_env,omitempty"`

	// RabbitMQ: URL is amqp://user@host:port/vhost or amqps://... without a
	// password; Shards the shard count of every exchange (a power of two
	// up to 128, the relay's and every worker's); the TLS files above
	// serve amqps.
	URL         string `json:"url,omitempty"`
	PasswordEnv string `json:"password_env,omitempty"`
	Shards      int    `json:"shards,omitempty"`
}

// KindOf is the channel's kind: Kafka when Kind is empty.
func (c *Channel) KindOf() Kind {
	if c.Kind == "" {
		return Kafka
	}
	return c.Kind
}

// Where names the channel's broker without anything secret: the Kafka
// seed brokers, or the RabbitMQ URL (which carries no password).
func (c *Channel) Where() string {
	if c.KindOf() == RabbitMQ {
		return c.URL
	}
	return strings.Join(c.Brokers, ",")
}

// Plan is a migration: its name, the channel it leaves, the channel it goes
// to (the same cluster with another topic template is valid: moving a topic
// to more partitions) and the consumer groups that must follow.
type Plan struct {
	Name   string
	Old    Channel
	New    Channel
	Groups []string
}

var (
	planName = route.PlanName
	envName  = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)
)

// validate names the first problem of the plan, by field.
func (p *Plan) validate() error {
	if !planName.MatchString(p.Name) {
		return fmt.Errorf("migration: plan name %q: want 1-63 of a-z, 0-9, '_', '.', '-', starting with a letter or digit", p.Name)
	}
	if err := p.Old.validate("old"); err != nil {
		return err
	}
	if err := p.New.validate("new"); err != nil {
		return err
	}
	if p.Old.same(&p.New) {
		return errors.New("migration: the old and the new channel are the same (same broker, same topic template)")
	}
	if len(p.Groups) == 0 {
		return errors.New("migration: Plan.Groups is empty: name the consumer groups that must follow")
	}
	for _, g := range p.Groups {
		if strings.TrimSpace(g) == "" || strings.ContainsAny(g, ", \t\n") {
			return fmt.Errorf("migration: consumer group %q: want a name without spaces or commas", g)
		}
	}
	return nil
}

func (c *Channel) validate(side string) error {
	if c.TopicTemplate == "" {
		return fmt.Errorf("migration: %s channel: no topic template", side)
	}
	// The relay fills it as it fills its own --topic-template: one check.
	if err := topicname.CheckTemplate(c.TopicTemplate); err != nil {
		return fmt.Errorf("migration: %s channel: topic template %w", side, err)
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return fmt.Errorf("migration: %s channel: a TLS client certificate needs both the certificate and the key file", side)
	}
	switch c.Kind {
	case "", Kafka:
		return c.validateKafka(side)
	case RabbitMQ:
		return c.validateRabbitMQ(side)
	}
	return fmt.Errorf("migration: %s channel: kind %q: want %q or %q", side, c.Kind, Kafka, RabbitMQ)
}

func (c *Channel) validateKafka(side string) error {
	switch {
	case len(c.Brokers) == 0:
		return fmt.Errorf("migration: %s channel: no brokers", side)
	case slices.Contains(c.Brokers, ""):
		return fmt.Errorf("migration: %s channel: an empty broker address", side)
	case c.URL != "" || c.PasswordEnv != "" || c.Shards != 0:
		return fmt.Errorf("migration: %s channel: url, password_env and shards are RabbitMQ settings, and the channel is Kafka "+
			"(kind %q)", side, RabbitMQ)
	}
	switch c.SASLMechanism {
	case "":
		if c.SASLUsername != "" || c.SASLPasswordEnv != "" {
			return fmt.Errorf("migration: %s channel: a SASL username or password variable without a SASL mechanism", side)
		}
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if c.SASLUsername == "" || !envName.MatchString(c.SASLPasswordEnv) {
			return fmt.Errorf("migration: %s channel: SASL %s needs a username and the name of the environment variable "+
				"holding the password (never the password itself), got %q", side, c.SASLMechanism, c.SASLPasswordEnv)
		}
	default:
		return fmt.Errorf("migration: %s channel: SASL mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", side, c.SASLMechanism)
	}
	return nil
}

func (c *Channel) validateRabbitMQ(side string) error {
	switch {
	case len(c.Brokers) > 0 || c.TLS || c.SASLMechanism != "" || c.SASLUsername != "" || c.SASLPasswordEnv != "":
		return fmt.Errorf("migration: %s channel: brokers, tls and sasl_* are Kafka settings, and the channel is RabbitMQ "+
			"(which uses TLS when its url is amqps://)", side)
	case c.PasswordEnv != "" && !envName.MatchString(c.PasswordEnv):
		return fmt.Errorf("migration: %s channel: password_env %q: want the name of the environment variable holding the "+
			"password (never the password itself)", side, c.PasswordEnv)
	}
	if err := rabbitmq.CheckShards(c.Shards); err != nil {
		return fmt.Errorf("migration: %s channel: shards: %w", side, err)
	}
	pc := c.rabbitPlan(side)
	conn := rabbitmq.Conn{URL: pc.URL, TLS: pc.TLS}
	if err := conn.Check(pc.Names()); err != nil {
		return fmt.Errorf("migration: %w", err)
	}
	return nil
}

// same reports whether c and d are one channel: the same kind, broker and
// topic template.
func (c *Channel) same(d *Channel) bool {
	if c.KindOf() != d.KindOf() || c.TopicTemplate != d.TopicTemplate {
		return false
	}
	if c.KindOf() == RabbitMQ {
		return sameRabbitMQ(c.URL, d.URL)
	}
	return slices.Equal(sorted(c.Brokers), sorted(d.Brokers))
}

// SameBroker reports whether c and d reach one broker: Kafka channels
// with the same bootstrap brokers, RabbitMQ channels on the same host and
// vhost (whoever logs in). Channels of different kinds never do.
func (c Channel) SameBroker(d Channel) bool {
	if c.KindOf() != d.KindOf() {
		return false
	}
	if c.KindOf() == RabbitMQ {
		return sameRabbitMQ(c.URL, d.URL)
	}
	return slices.Equal(sorted(c.Brokers), sorted(d.Brokers))
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// Names reports whether topic is one the channel's template names: the
// template with each placeholder standing for one or more characters.
func (c Channel) Names(topic string) bool {
	var b strings.Builder
	b.WriteString("^")
	rest := c.TopicTemplate
	for {
		i := strings.IndexByte(rest, '{')
		j := strings.IndexByte(rest[max(i, 0):], '}')
		if i < 0 || j < 0 {
			break
		}
		b.WriteString(regexp.QuoteMeta(rest[:i]) + ".+")
		rest = rest[i+j+1:]
	}
	b.WriteString(regexp.QuoteMeta(rest) + "$")
	re, err := regexp.Compile(b.String())
	return err == nil && re.MatchString(topic)
}
