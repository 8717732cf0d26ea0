package ferrytest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Environment variables of the broker's secure listeners, printed by
// `scripts/stack up` (see scripts/stack).
const (
	EnvKafkaSASLSSLBrokers = "FERRY_TEST_KAFKA_SASL_SSL_BROKERS"
	EnvKafkaMTLSBrokers    = "FERRY_TEST_KAFKA_MTLS_BROKERS"
	EnvKafkaCAFile         = "FERRY_TEST_KAFKA_CA_FILE"
	EnvKafkaClientCertFile = "FERRY_TEST_KAFKA_CLIENT_CERT_FILE"
	EnvKafkaClientKeyFile  = "FERRY_TEST_KAFKA_CLIENT_KEY_FILE"
	EnvKafkaSASLUser       = "FERRY_TEST_KAFKA_SASL_USER"
	EnvKafkaSASLPassword   = "FERRY_TEST_KAFKA_SASL_PASSWORD"
)

// SecureKafka is how to reach the stack's broker through its secure
// listeners. The plaintext listener (Brokers) is the same broker: a topic
// made there is the same topic here.
type SecureKafka struct {
	// SASLSSLBrokers is the listener that takes TLS and then SASL:
	// SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN.
	SASLSSLBrokers string
	// MTLSBrokers is the listener that takes TLS with a client certificate
	// signed by the CA, and no SASL.
	MTLSBrokers string
	// CAFile is the PEM certificate of the CA that signed the broker's
	// certificate (SAN 127.0.0.1 and localhost) and the client's.
	CAFile                        string
	ClientCertFile, ClientKeyFile string
	// User and Password are the SASL user's, the same for every mechanism.
	User, Password string
}

// Secure returns the secure listeners of the stack's broker. Like every
// integration helper it skips with -short and fails without a stack.
func Secure(t testing.TB) *SecureKafka {
	t.Helper()
	get := func(env string) string {
		t.Helper()
		if testing.Short() {
			t.Skipf("integration test: skipped with -short")
		}
		v := os.Getenv(env)
		if v == "" {
			t.Fatalf("%s is not set: run `make test`, or `eval \"$(scripts/stack up)\"` before go test "+
				"(a stack started before the secure listeners existed needs `scripts/stack down; scripts/stack up`)", env)
		}
		return v
	}
	return &SecureKafka{
		SASLSSLBrokers: get(EnvKafkaSASLSSLBrokers),
		MTLSBrokers:    get(EnvKafkaMTLSBrokers),
		CAFile:         get(EnvKafkaCAFile),
		ClientCertFile: get(EnvKafkaClientCertFile),
		ClientKeyFile:  get(EnvKafkaClientKeyFile),
		User:           get(EnvKafkaSASLUser),
		Password:       get(EnvKafkaSASLPassword),
	}
}

// Client returns a franz-go client that reaches the broker through the
// SASL_SSL listener as the SASL user with SCRAM-SHA-512, closed when the
// test ends.
func (s *SecureKafka) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	caPEM, err := os.ReadFile(s.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("%s holds no PEM certificate", s.CAFile)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(s.SASLSSLBrokers),
		kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}),
		kgo.SASL(scram.Auth{User: s.User, Pass: s.Password}.AsSha512Mechanism()),
	}, opts...)...)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// UntrustedCA writes the PEM certificate of a CA made for this test alone,
// which signed nothing the broker holds, and returns its path: a client that
// trusts only it must refuse the broker's certificate.
func UntrustedCA(t testing.TB) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "Ferry untrusted test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "untrusted-ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
