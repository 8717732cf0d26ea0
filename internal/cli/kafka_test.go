package cli_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

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

// --kafka-compression reaches the producer: each codec's batches arrive
// compressed with it (a compressible batch; franz-go sends a batch
// uncompressed when that is smaller), and the default is none.
func TestCompressionReachesTheProducer(t *testing.T) {
	t.Parallel()
	brokers := strings.Join(ferrytest.Brokers(t), ",")
	for _, c := range []struct {
		flag string
		attr uint8 // the record batch's compression attribute
	}{{"", 0}, {"none", 0}, {"gzip", 1}, {"snappy", 2}, {"lz4", 3}, {"zstd", 4}} {
		t.Run(cmp.Or(c.flag, "default"), func(t *testing.T) {
			t.Parallel()
			k := cli.Kafka{Brokers: brokers, Compression: c.flag}
			opts, err := k.Opts(nil)
			if err != nil {
				t.Fatal(err)
			}
			topic := ferrytest.Topic(t, 1)
			cl := ferrytest.Client(t, opts...)
			if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: bytes.Repeat([]byte("ferry "), 1000)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			cons := ferrytest.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			fs := cons.PollFetches(ctx)
			if err := fs.Err0(); err != nil {
				t.Fatal(err)
			}
			recs := fs.Records()
			if len(recs) != 1 {
				t.Fatalf("fetched %d records, want 1", len(recs))
			}
			if got := recs[0].Attrs.CompressionType(); got != c.attr {
				t.Errorf("--kafka-compression %q: the batch arrived with codec %d, want %d", c.flag, got, c.attr)
			}
		})
	}
	if _, err := (&cli.Kafka{Brokers: brokers, Compression: "brotli"}).Opts(nil); err == nil || !strings.Contains(err.Error(), "--kafka-compression") {
		t.Errorf("an unknown codec: %v, want an error naming --kafka-compression", err)
	}
}
