// Package kafkaconf turns the Kafka settings shared by the relay and worker
// binaries (brokers, TLS, SASL) into franz-go options.
package kafkaconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/ferryhq/ferry/internal/cli"
)

// SASL mechanisms accepted by Config.SASLMechanism.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// Config is how a binary reaches Kafka.
type Config struct {
	Brokers       string // comma-separated host:port list
	ClientID      string
	TLS           bool
	TLSCAFile     string
	TLSCertFile   string
	TLSKeyFile    string
	TLSSkipVerify bool
	SASLMechanism string
	SASLUsername  string
	SASLPassword  string // never logged
}

// RegisterFlags binds the settings to flags whose defaults come from
// FERRY_KAFKA_* environment variables.
func (c *Config) RegisterFlags(fs *flag.FlagSet, clientID string) {
	fs.StringVar(&c.Brokers, "kafka-brokers", cli.Env("FERRY_KAFKA_BROKERS", ""), "Kafka seed brokers, host:port[,host:port] (env FERRY_KAFKA_BROKERS)")
	fs.StringVar(&c.ClientID, "kafka-client-id", cli.Env("FERRY_KAFKA_CLIENT_ID", clientID), "Kafka client id (env FERRY_KAFKA_CLIENT_ID)")
	fs.BoolVar(&c.TLS, "kafka-tls", cli.EnvBool("FERRY_KAFKA_TLS", false), "connect to Kafka with TLS (env FERRY_KAFKA_TLS)")
	fs.StringVar(&c.TLSCAFile, "kafka-tls-ca-file", cli.Env("FERRY_KAFKA_TLS_CA_FILE", ""), "PEM file of CAs that sign the brokers' certificates (env FERRY_KAFKA_TLS_CA_FILE)")
	fs.StringVar(&c.TLSCertFile, "kafka-tls-cert-file", cli.Env("FERRY_KAFKA_TLS_CERT_FILE", ""), "PEM client certificate for mutual TLS (env FERRY_KAFKA_TLS_CERT_FILE)")
	fs.StringVar(&c.TLSKeyFile, "kafka-tls-key-file", cli.Env("FERRY_KAFKA_TLS_KEY_FILE", ""), "PEM client key for mutual TLS (env FERRY_KAFKA_TLS_KEY_FILE)")
	fs.BoolVar(&c.TLSSkipVerify, "kafka-tls-insecure-skip-verify", cli.EnvBool("FERRY_KAFKA_TLS_INSECURE_SKIP_VERIFY", false), "do not verify the brokers' certificates (env FERRY_KAFKA_TLS_INSECURE_SKIP_VERIFY)")
	fs.StringVar(&c.SASLMechanism, "kafka-sasl-mechanism", cli.Env("FERRY_KAFKA_SASL_MECHANISM", ""), "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (env FERRY_KAFKA_SASL_MECHANISM)")
	fs.StringVar(&c.SASLUsername, "kafka-sasl-username", cli.Env("FERRY_KAFKA_SASL_USERNAME", ""), "SASL user (env FERRY_KAFKA_SASL_USERNAME)")
	// The password is read from the environment only, so it never shows in ps.
	c.SASLPassword = os.Getenv("FERRY_KAFKA_SASL_PASSWORD")
}

// SeedBrokers returns the broker list.
func (c *Config) SeedBrokers() []string {
	var out []string
	for _, b := range strings.Split(c.Brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// Validate reports the first wrong setting by its flag name.
func (c *Config) Validate() error {
	if len(c.SeedBrokers()) == 0 {
		return errors.New("--kafka-brokers (FERRY_KAFKA_BROKERS) is required")
	}
	for _, b := range c.SeedBrokers() {
		if !strings.Contains(b, ":") {
			return fmt.Errorf("--kafka-brokers: %q is not host:port", b)
		}
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("--kafka-tls-cert-file and --kafka-tls-key-file go together")
	}
	if !c.TLS && (c.TLSCAFile != "" || c.TLSCertFile != "" || c.TLSSkipVerify) {
		return errors.New("--kafka-tls-* settings need --kafka-tls")
	}
	switch strings.ToUpper(c.SASLMechanism) {
	case "":
		if c.SASLUsername != "" || c.SASLPassword != "" {
			return errors.New("--kafka-sasl-username and FERRY_KAFKA_SASL_PASSWORD need --kafka-sasl-mechanism")
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if c.SASLUsername == "" || c.SASLPassword == "" {
			return fmt.Errorf("--kafka-sasl-mechanism %s needs --kafka-sasl-username and FERRY_KAFKA_SASL_PASSWORD", c.SASLMechanism)
		}
	default:
		return fmt.Errorf("--kafka-sasl-mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", c.SASLMechanism)
	}
	return nil
}

// Opts returns the franz-go options for these settings.
func (c *Config) Opts() ([]kgo.Opt, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	opts := []kgo.Opt{kgo.SeedBrokers(c.SeedBrokers()...)}
	if c.ClientID != "" {
		opts = append(opts, kgo.ClientID(c.ClientID))
	}
	if c.TLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.TLSSkipVerify} //nolint:gosec // opt-in flag
		if c.TLSCAFile != "" {
			pem, err := os.ReadFile(c.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("--kafka-tls-ca-file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--kafka-tls-ca-file %s: no PEM certificate in it", c.TLSCAFile)
			}
			tc.RootCAs = pool
		}
		if c.TLSCertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
			if err != nil {
				return nil, fmt.Errorf("--kafka-tls-cert-file/--kafka-tls-key-file: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	switch strings.ToUpper(c.SASLMechanism) {
	case SASLPlain:
		opts = append(opts, kgo.SASL(plain.Auth{User: c.SASLUsername, Pass: c.SASLPassword}.AsMechanism()))
	case SASLScramSHA256:
		opts = append(opts, kgo.SASL(scram.Auth{User: c.SASLUsername, Pass: c.SASLPassword}.AsSha256Mechanism()))
	case SASLScramSHA512:
		opts = append(opts, kgo.SASL(scram.Auth{User: c.SASLUsername, Pass: c.SASLPassword}.AsSha512Mechanism()))
	}
	return opts, nil
}

// String describes the settings without the password.
func (c *Config) String() string {
	s := "brokers=" + c.Brokers
	if c.TLS {
		s += " tls=on"
	}
	if c.SASLMechanism != "" {
		s += " sasl=" + c.SASLMechanism + " sasl_user=" + c.SASLUsername + " sasl_password=<redacted>"
	}
	return s
}
