// Package kafkaauth builds the TLS and SASL settings of a Kafka connection,
// once for every place that makes one: the command lines' --kafka-* flags
// (internal/cli) and a live migration's channels (package migration). The
// callers name their own settings in the errors.
package kafkaauth

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// TLSFiles are the files of a TLS connection: the CA that signs the
// brokers' certificates and a client certificate with its key (both or
// neither), each optional.
type TLSFiles struct {
	CA, Cert, Key string
	SkipVerify    bool
}

// Names are how the caller's settings are called in errors: the CA file,
// and the client certificate and key.
type Names struct {
	CA, CertKey string
}

// TLS returns the TLS configuration of f; an error names the setting at
// fault by n.
func TLS(f TLSFiles, n Names) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: f.SkipVerify} //nolint:gosec // opt-in setting
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.CA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in it", n.CA, f.CA)
		}
		tc.RootCAs = pool
	}
	if f.Cert != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.CertKey, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// SASL returns the option that authenticates with mechanism (PLAIN,
// SCRAM-SHA-256 or SCRAM-SHA-512, in any case), nil for none or one it does
// not know: the callers validate the mechanism first.
func SASL(mechanism, user, pass string) kgo.Opt {
	switch strings.ToUpper(mechanism) {
	case "PLAIN":
		return kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism())
	case "SCRAM-SHA-256":
		return kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism())
	case "SCRAM-SHA-512":
		return kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism())
	}
	return nil
}
