package migration

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/kafkaauth"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// KafkaOpts returns the franz-go options that reach the channel's cluster:
// seed brokers, TLS and SASL. The SASL password is read from the
// environment variable the channel names (getenv; os.Getenv when nil) and
// is never part of an error.
func (c Channel) KafkaOpts(side string, getenv func(string) string) ([]kgo.Opt, error) {
	if err := c.validate(side); err != nil {
		return nil, err
	}
	if c.KindOf() != Kafka {
		return nil, fmt.Errorf("migration: %s channel is %s, not Kafka", side, c.KindOf())
	}
	if getenv == nil {
		getenv = os.Getenv
	}
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...)}
	if c.TLS || c.TLSCAFile != "" || c.TLSCertFile != "" {
		tc, err := kafkaauth.TLS(kafkaauth.TLSFiles{CA: c.TLSCAFile, Cert: c.TLSCertFile, Key: c.TLSKeyFile},
			kafkaauth.Names{CA: "tls_ca_file", CertKey: "tls_cert_file/tls_key_file"})
		if err != nil {
			return nil, fmt.Errorf("migration: %s channel: %w", side, err)
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if c.SASLMechanism == "" {
		return opts, nil
	}
	pass := getenv(c.SASLPasswordEnv)
	if pass == "" {
		return nil, fmt.Errorf("migration: %s channel: SASL %s: the environment variable %s (sasl_password_env) is empty or unset",
			side, c.SASLMechanism, c.SASLPasswordEnv)
	}
	opts = append(opts, kafkaauth.SASL(c.SASLMechanism, c.SASLUsername, pass))
	return opts, nil
}

// rabbitPlan is the channel as internal/rabbitmq reaches it; side names
// its settings in errors.
func (c *Channel) rabbitPlan(side string) rabbitmq.PlanChannel {
	return rabbitmq.PlanChannel{Side: side, URL: c.URL, PasswordEnv: c.PasswordEnv,
		TLS: kafkaauth.TLSFiles{CA: c.TLSCAFile, Cert: c.TLSCertFile, Key: c.TLSKeyFile}}
}

// sameRabbitMQ reports whether two RabbitMQ URLs reach the same vhost of
// the same broker, whoever logs in.
func sameRabbitMQ(a, b string) bool {
	ua, errA := url.Parse(a)
	ub, errB := url.Parse(b)
	if errA != nil || errB != nil {
		return a == b
	}
	vhost := func(u *url.URL) string {
		if u.Path == "" || u.Path == "/" {
			return "/"
		}
		v, err := url.PathUnescape(strings.TrimPrefix(u.Path, "/"))
		if err != nil {
			return u.Path
		}
		return v
	}
	return strings.EqualFold(ua.Host, ub.Host) && vhost(ua) == vhost(ub)
}

// Ping says whether the channel's broker answers within ctx: a Kafka
// cluster's metadata, or a RabbitMQ connection opened and closed. side
// ("old", "new") names the channel in errors; getenv reads its password
// (os.Getenv when nil).
func (c Channel) Ping(ctx context.Context, side string, getenv func(string) string) error {
	if c.KindOf() == RabbitMQ {
		pc := c.rabbitPlan(side)
		conn, err := pc.Conn(getenv)
		if err != nil {
			return fmt.Errorf("migration: %w", err)
		}
		done := make(chan error, 1)
		go func() {
			amqpConn, err := conn.Dial(pc.Names())
			if err == nil {
				err = amqpConn.CloseDeadline(time.Now().Add(5 * time.Second))
			}
			done <- err
		}()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	opts, err := c.KafkaOpts(side, getenv)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.Ping(ctx)
}
