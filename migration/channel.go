package migration

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
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
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.TLSCAFile != "" {
			pem, err := os.ReadFile(c.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("migration: %s channel: tls_ca_file: %w", side, err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("migration: %s channel: tls_ca_file %s: no PEM certificate in it", side, c.TLSCAFile)
			}
		}
		if c.TLSCertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
			if err != nil {
				return nil, fmt.Errorf("migration: %s channel: tls_cert_file/tls_key_file: %w", side, err)
			}
			tc.Certificates = []tls.Certificate{cert}
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
	switch c.SASLMechanism {
	case "PLAIN":
		opts = append(opts, kgo.SASL(plain.Auth{User: c.SASLUsername, Pass: pass}.AsMechanism()))
	case "SCRAM-SHA-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: c.SASLUsername, Pass: pass}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: c.SASLUsername, Pass: pass}.AsSha512Mechanism()))
	}
	return opts, nil
}
