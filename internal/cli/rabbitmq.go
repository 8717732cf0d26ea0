package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/kafkaauth"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// RabbitMQPasswordEnv holds the RabbitMQ user's password. It is read from
// the environment only, so that it never shows in ps, and it is never
// logged.
const RabbitMQPasswordEnv = "FERRY_RABBITMQ_PASSWORD"

// ErrRabbitMQRefused is a RabbitMQ connection refused for its credentials,
// its vhost or its TLS settings: retrying cannot cure it.
var ErrRabbitMQRefused = errors.New("rabbitmq refused the connection")

// RabbitMQ is how a binary reaches RabbitMQ: the --rabbitmq-* settings. It
// is in use when URL is set.
type RabbitMQ struct {
	URL           string
	Vhost         string
	TLSCAFile     string
	TLSCertFile   string
	TLSKeyFile    string
	TLSSkipVerify bool
	Shards        *int
	Password      string // never logged
	Name          string // the connections' name in the management UI
}

// rabbitNames are the settings' names in errors.
var rabbitNames = rabbitmq.Names{
	URL: "--rabbitmq-url", Password: RabbitMQPasswordEnv, Vhost: "--rabbitmq-vhost",
	CA: "--rabbitmq-tls-ca-file", CertKey: "--rabbitmq-tls-cert-file and --rabbitmq-tls-key-file",
}

// Register binds the settings to f; name is the connections' name.
func (r *RabbitMQ) Register(f *Flags, name string) {
	r.Name = name
	f.StringVar(&r.URL, "rabbitmq-url", "", "RabbitMQ instead of Kafka: amqp://user@host:5672/vhost or amqps://...; no password in it, the password comes from "+RabbitMQPasswordEnv+" only")
	f.StringVar(&r.Vhost, "rabbitmq-vhost", "", "RabbitMQ vhost, instead of the URL's")
	f.StringVar(&r.TLSCAFile, "rabbitmq-tls-ca-file", "", "PEM file of CAs that sign the RabbitMQ broker's certificate (amqps)")
	f.StringVar(&r.TLSCertFile, "rabbitmq-tls-cert-file", "", "PEM client certificate for RabbitMQ (amqps)")
	f.StringVar(&r.TLSKeyFile, "rabbitmq-tls-key-file", "", "PEM client key for RabbitMQ (amqps)")
	f.BoolVar(&r.TLSSkipVerify, "rabbitmq-tls-insecure-skip-verify", false, "do not verify the RabbitMQ broker's certificate")
	r.Shards = f.Int("rabbitmq-shards", rabbitmq.ShardsDefault, "RabbitMQ shards per topic: a power of two up to 128, the same for the relay and every worker of the channel")
	r.Password = os.Getenv(RabbitMQPasswordEnv)
}

// NShards is the shard count.
func (r *RabbitMQ) NShards() int {
	if r.Shards == nil {
		return rabbitmq.ShardsDefault
	}
	return *r.Shards
}

// Enabled reports whether RabbitMQ is the channel.
func (r *RabbitMQ) Enabled() bool { return r.URL != "" }

// Conn returns the connection settings.
func (r *RabbitMQ) Conn() *rabbitmq.Conn {
	return &rabbitmq.Conn{
		URL: r.URL, Password: r.Password, Vhost: r.Vhost, Name: r.Name,
		TLS: kafkaauth.TLSFiles{CA: r.TLSCAFile, Cert: r.TLSCertFile, Key: r.TLSKeyFile, SkipVerify: r.TLSSkipVerify},
	}
}

// Names are the settings' names, for errors of the engines.
func (r *RabbitMQ) Names() rabbitmq.Names { return rabbitNames }

// Validate reports the first wrong setting by its flag name, as a usage
// error.
func (r *RabbitMQ) Validate() error {
	if err := r.Conn().Check(rabbitNames); err != nil {
		return Usagef("%s", err)
	}
	if err := rabbitmq.CheckShards(r.NShards()); err != nil {
		return Usagef("--rabbitmq-shards: %s", err)
	}
	return nil
}

// String describes the connection without its password.
func (r *RabbitMQ) String() string { return r.Conn().Redacted() }

// Check connects once: a refusal that retrying cannot cure (the password,
// the vhost, an untrusted certificate) is an error that says what to fix;
// a broker that does not answer is only a warning, since the engines keep
// trying.
func (r *RabbitMQ) Check(ctx context.Context, logger *slog.Logger) error {
	if err := r.Validate(); err != nil {
		return err
	}
	type result struct {
		conn *amqp.Connection
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := r.Conn().Dial(rabbitNames)
		done <- result{conn, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if res.err == nil {
		_ = res.conn.Close()
		return nil
	}
	var ne net.Error
	var ae *amqp.Error
	if errors.As(res.err, &ne) || (errors.As(res.err, &ae) && ae.Code != amqp.AccessRefused) {
		logger.Warn("no answer from RabbitMQ at start-up; the engine keeps trying",
			slog.String("rabbitmq", r.String()), slog.String("error", res.err.Error()))
		return nil
	}
	return fmt.Errorf("%w: %w", ErrRabbitMQRefused, res.err)
}
