package migration

import (
	"fmt"
	"os"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/kafkaauth"
)

// KafkaOpts returns the franz-go options that reach the channel's cluster:
// seed brokers, TLS and SASL. The SASL password is read from the
// environment variable the channel names (getenv; os.Getenv when nil) and
// is never part of an error.
func (c Channel) KafkaOpts(side string, getenv func(string) string) ([]kgo.Opt, error) {
	if err := c.validate(side); err != nil {
		return nil, err
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
