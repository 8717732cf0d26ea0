package cli

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/ferryhq/ferry/internal/kafkaauth"
	"github.com/ferryhq/ferry/internal/rawsock"
)

// kafkaDialTimeout bounds a connection's dial and TLS handshake, as
// franz-go's own dialer does by default (kgo.DialTimeout).
const kafkaDialTimeout = 10 * time.Second

// SASL mechanisms accepted by Kafka.SASLMechanism.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASLPasswordEnv holds the SASL password. It is read from the environment
// only, so that it never shows in ps, and it is never logged.
const SASLPasswordEnv = "FERRY_KAFKA_SASL_PASSWORD"

// Kafka is how a binary reaches Kafka: the --kafka-* settings.
type Kafka struct {
	Brokers          string // comma-separated host:port list
	ClientID         string
	TLS              bool
	TLSCAFile        string
	TLSCertFile      string
	TLSKeyFile       string
	TLSSkipVerify    bool
	SASLMechanism    string
	SASLUsername     string
	SASLPassword     string // never logged
	AutoCreateTopics bool
	Compression      string // a key of compressionCodecs; empty: CompressionDefault
}

// compressionCodecs are the values of --kafka-compression. A batch goes out
// compressed only when that makes it smaller.
var compressionCodecs = map[string]kgo.CompressionCodec{
	"none":   kgo.NoCompression(),
	"gzip":   kgo.GzipCompression(),
	"snappy": kgo.SnappyCompression(),
	"lz4":    kgo.Lz4Compression(),
	"zstd":   kgo.ZstdCompression(),
}

// CompressionDefault is no compression, as the Kafka producer's and Kafka
// Connect's own default. At the rates most outboxes run a batch holds a
// few records, which a codec barely shrinks, and the broker decompresses
// every compressed batch to validate it: at 1,000 events/s snappy cost the
// broker 0.19 of a core against 0.14 without, and the relay 0.06 against
// 0.05 (docs/relay.md#cpu). Where the network is the cost, choose a codec.
const CompressionDefault = "none"

// Register binds the settings to f; clientID is the default client id.
func (k *Kafka) Register(f *Flags, clientID string) {
	f.StringVar(&k.Brokers, "kafka-brokers", "", "Kafka seed brokers, host:port[,host:port]")
	f.StringVar(&k.ClientID, "kafka-client-id", clientID, "Kafka client id")
	f.BoolVar(&k.TLS, "kafka-tls", false, "connect to Kafka with TLS")
	f.StringVar(&k.TLSCAFile, "kafka-tls-ca-file", "", "PEM file of CAs that sign the brokers' certificates")
	f.StringVar(&k.TLSCertFile, "kafka-tls-cert-file", "", "PEM client certificate for mutual TLS")
	f.StringVar(&k.TLSKeyFile, "kafka-tls-key-file", "", "PEM client key for mutual TLS")
	f.BoolVar(&k.TLSSkipVerify, "kafka-tls-insecure-skip-verify", false, "do not verify the brokers' certificates")
	f.StringVar(&k.SASLMechanism, "kafka-sasl-mechanism", "", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	f.StringVar(&k.SASLUsername, "kafka-sasl-username", "", "SASL user; the password comes from "+SASLPasswordEnv+" only")
	f.BoolVar(&k.AutoCreateTopics, "kafka-auto-create-topics", false, "let the broker create missing topics (needs auto.create.topics.enable on the broker)")
	f.StringVar(&k.Compression, "kafka-compression", CompressionDefault, "compression of the batches produced: none, gzip, snappy, lz4 or zstd (zstd needs Kafka 2.1 and consumers that decode it)")
	k.SASLPassword = os.Getenv(SASLPasswordEnv)
}

// SeedBrokers returns the broker list.
func (k *Kafka) SeedBrokers() []string {
	var out []string
	for _, b := range strings.Split(k.Brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// Validate reports the first wrong setting by its flag name, as a usage
// error.
func (k *Kafka) Validate() error {
	if len(k.SeedBrokers()) == 0 {
		return Usagef("--kafka-brokers (FERRY_KAFKA_BROKERS) is required")
	}
	for _, b := range k.SeedBrokers() {
		if !strings.Contains(b, ":") {
			return Usagef("--kafka-brokers: %q is not host:port", b)
		}
	}
	if (k.TLSCertFile == "") != (k.TLSKeyFile == "") {
		return Usagef("--kafka-tls-cert-file and --kafka-tls-key-file go together")
	}
	if !k.TLS && (k.TLSCAFile != "" || k.TLSCertFile != "" || k.TLSSkipVerify) {
		return Usagef("--kafka-tls-* settings need --kafka-tls")
	}
	if _, ok := compressionCodecs[cmp.Or(k.Compression, CompressionDefault)]; !ok {
		return Usagef("--kafka-compression %q: want none, gzip, snappy, lz4 or zstd", k.Compression)
	}
	switch strings.ToUpper(k.SASLMechanism) {
	case "":
		if k.SASLUsername != "" || k.SASLPassword != "" {
			return Usagef("--kafka-sasl-username and %s need --kafka-sasl-mechanism", SASLPasswordEnv)
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if k.SASLUsername == "" || k.SASLPassword == "" {
			return Usagef("--kafka-sasl-mechanism %s needs --kafka-sasl-username and %s", k.SASLMechanism, SASLPasswordEnv)
		}
	default:
		return Usagef("--kafka-sasl-mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", k.SASLMechanism)
	}
	return nil
}

// Opts validates the settings and returns them as franz-go options. With a
// logger, franz-go logs through it (component=kafka).
func (k *Kafka) Opts(logger *slog.Logger) ([]kgo.Opt, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	opts := []kgo.Opt{kgo.SeedBrokers(k.SeedBrokers()...)}
	if k.ClientID != "" {
		opts = append(opts, kgo.ClientID(k.ClientID))
	}
	var tc *tls.Config
	if k.TLS {
		var err error
		if tc, err = k.tlsConfig(); err != nil {
			return nil, err
		}
	}
	// Sockets read and written by raw system calls: the process's wake-ups
	// for Kafka's responses do not wake the Go runtime's monitor thread
	// (internal/rawsock). TLS, when on, runs above them.
	opts = append(opts, kgo.Dialer(rawsock.Dialer(kafkaDialTimeout, tc)))
	if o := kafkaauth.SASL(k.SASLMechanism, k.SASLUsername, k.SASLPassword); o != nil {
		opts = append(opts, o)
	}
	if k.AutoCreateTopics {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	opts = append(opts, kgo.ProducerBatchCompression(compressionCodecs[cmp.Or(k.Compression, CompressionDefault)]))
	if logger != nil {
		opts = append(opts, kgo.WithLogger(kslog.New(logger.With(slog.String("component", "kafka")))))
	}
	return opts, nil
}

func (k *Kafka) tlsConfig() (*tls.Config, error) {
	tc, err := kafkaauth.TLS(kafkaauth.TLSFiles{CA: k.TLSCAFile, Cert: k.TLSCertFile, Key: k.TLSKeyFile, SkipVerify: k.TLSSkipVerify},
		kafkaauth.Names{CA: "--kafka-tls-ca-file", CertKey: "--kafka-tls-cert-file/--kafka-tls-key-file"})
	if err != nil {
		return nil, Usagef("%w", err)
	}
	return tc, nil
}

// String describes the settings without the password.
func (k *Kafka) String() string {
	s := "brokers=" + k.Brokers
	if k.TLS {
		s += " tls=on"
	}
	if k.SASLMechanism != "" {
		s += " sasl=" + k.SASLMechanism + " sasl_user=" + k.SASLUsername + " sasl_password=<redacted>"
	}
	return s
}

// ErrKafkaRefused marks a connection to Kafka that the security settings
// refused, on either side: SASL credentials or a mechanism the broker does
// not take, a broker certificate the client does not trust, a client
// certificate the broker does not. Retrying with the same settings cannot
// succeed.
var ErrKafkaRefused = errors.New("kafka refused the connection")

// CheckTimeoutDefault bounds Check.
const CheckTimeoutDefault = 15 * time.Second

// Check connects to the seed brokers once, as the engines would, and asks
// for the cluster's metadata. It returns an error wrapping ErrKafkaRefused,
// naming the settings to fix, when the connection's security refused it: a
// binary that cannot authenticate should say so at start-up and exit, as it
// does when PostgreSQL refuses its password, rather than retry forever while
// it reports ready. A broker that is down, unreachable or closes the
// connection (franz-go's message then guesses why) is no reason to stop,
// since the engines retry: Check logs a warning and returns nil.
func (k *Kafka) Check(ctx context.Context, logger *slog.Logger) error {
	opts, err := k.Opts(nil) // the engines' clients log; this one's error says it all
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, CheckTimeoutDefault)
	defer cancel()
	err = cl.Ping(ctx)
	if err == nil {
		return nil
	}
	if refused := k.refused(err); refused != nil {
		return refused
	}
	logger.Warn("no answer from Kafka at start-up; the client keeps trying",
		slog.String("kafka", k.String()), slog.String("error", err.Error()))
	return nil
}

// refused explains err when the connection's security refused it, and
// returns nil otherwise.
func (k *Kafka) refused(err error) error {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		op        *net.OpError
	)
	switch {
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid), errors.As(err, &verify):
		return fmt.Errorf("%w: %s: the broker's certificate is not trusted (check --kafka-tls-ca-file, "+
			"and that the certificate names the host in --kafka-brokers): %w", ErrKafkaRefused, k.Brokers, err)
	case errors.As(err, &op) && op.Op == "remote error": // a TLS alert from the broker
		return fmt.Errorf("%w: %s: the broker refused the TLS handshake (does it want a client certificate, "+
			"--kafka-tls-cert-file and --kafka-tls-key-file, signed by a CA it trusts?): %w", ErrKafkaRefused, k.Brokers, err)
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		return fmt.Errorf("%w: %s: SASL %s authentication as %q failed (check --kafka-sasl-mechanism, "+
			"--kafka-sasl-username and %s): %w", ErrKafkaRefused, k.Brokers, strings.ToUpper(k.SASLMechanism), k.SASLUsername, SASLPasswordEnv, err)
	}
	return nil
}
