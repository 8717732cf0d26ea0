package cli_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// Check fails only on what retrying cannot cure, the connection's security
// refused (ErrKafkaRefused); a broker that is down or closes the connection
// is a warning, since the engines retry, and a start-up must not fail for it.
func TestCheckRefusesOnlyWhatRetryingCannotCure(t *testing.T) {
	t.Parallel()
	sec := ferrytest.Secure(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	scram := func(password string) cli.Kafka {
		return cli.Kafka{Brokers: sec.SASLSSLBrokers, TLS: true, TLSCAFile: sec.CAFile,
			SASLMechanism: cli.SASLScramSHA512, SASLUsername: sec.User, SASLPassword: password}
	}
	cases := []struct {
		name    string
		kafka   cli.Kafka
		refused bool
		warning string // what the warning says, when there is one
	}{
		{"authenticated", scram(sec.Password), false, ""},
		{"client certificate", cli.Kafka{Brokers: sec.MTLSBrokers, TLS: true, TLSCAFile: sec.CAFile,
			TLSCertFile: sec.ClientCertFile, TLSKeyFile: sec.ClientKeyFile}, false, ""},
		{"wrong password", scram("wrong-password"), true, ""},
		{"SASL where the listener has none", cli.Kafka{Brokers: ferrytest.Brokers(t)[0],
			SASLMechanism: cli.SASLPlain, SASLUsername: sec.User, SASLPassword: sec.Password}, true, ""},
		{"broker down", cli.Kafka{Brokers: down}, false, "connection refused"},
		{"TLS to the plaintext listener: the broker closes, as one shutting down does", cli.Kafka{Brokers: ferrytest.Brokers(t)[0], TLS: true}, false,
			"broker closed the connection"},
	}
	for _, c := range cases {
		var logs bytes.Buffer
		err := c.kafka.Check(context.Background(), slog.New(slog.NewTextHandler(&logs, nil)))
		if refused := errors.Is(err, cli.ErrKafkaRefused); refused != c.refused || (err != nil && !refused) {
			t.Errorf("%s: Check = %v, want refused %v", c.name, err, c.refused)
		}
		if got := logs.String(); (c.warning == "") != (got == "") || !strings.Contains(got, c.warning) {
			t.Errorf("%s: logged %q, want a warning saying %q (or none when empty)", c.name, got, c.warning)
		}
	}
}
