package inbox

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/kafkaauth"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
)

// The options that choose the cluster and the credentials are the
// channel's; every other option of the worker's reaches the channel's
// clients too. It pins how reachesCluster recognizes franz-go's options,
// however the caller builds them.
func TestChannelKafkaOptsKeepAllButTheClustersAddressAndSecurity(t *testing.T) {
	t.Parallel()
	var d net.Dialer
	dropped := map[string]kgo.Opt{
		"SeedBrokers":        kgo.SeedBrokers("a:9092"),
		"DialTLS":            kgo.DialTLS(),
		"DialTLSConfig":      kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}),
		"Dialer":             kgo.Dialer(d.DialContext),
		"SASL":               kgo.SASL(plain.Auth{User: "u", Pass: "p"}.AsMechanism()),
		"kafkaauth.SASL":     kafkaauth.SASL("SCRAM-SHA-512", "u", "p"),
		"SASL, no mechanism": kgo.SASL(),
	}
	kept := map[string]kgo.Opt{
		"SessionTimeout":           kgo.SessionTimeout(6 * time.Second),
		"HeartbeatInterval":        kgo.HeartbeatInterval(time.Second),
		"RebalanceTimeout":         kgo.RebalanceTimeout(time.Minute),
		"ClientID":                 kgo.ClientID("billing"),
		"FetchMaxWait":             kgo.FetchMaxWait(time.Second),
		"FetchMaxBytes":            kgo.FetchMaxBytes(1 << 20),
		"WithLogger":               kgo.WithLogger(kslog.New(slog.New(slog.DiscardHandler))),
		"DialTimeout":              kgo.DialTimeout(3 * time.Second),
		"RequestTimeoutOverhead":   kgo.RequestTimeoutOverhead(5 * time.Second),
		"MetadataMaxAge":           kgo.MetadataMaxAge(time.Minute),
		"ProducerBatchCompression": kgo.ProducerBatchCompression(kgo.NoCompression()),
		"AllowAutoTopicCreation":   kgo.AllowAutoTopicCreation(),
		"ConnIdleTimeout":          kgo.ConnIdleTimeout(time.Minute),
	}
	// Made in closures called through a variable, where the compiler
	// inlines the constructors and names their closures after the caller
	// ("...func3.SeedBrokers.1").
	for i, mk := range []func() kgo.Opt{
		func() kgo.Opt { return kgo.SeedBrokers("a:9092") },
		func() kgo.Opt { return kgo.SASL(plain.Auth{User: "u", Pass: "p"}.AsMechanism()) },
		func() kgo.Opt { return kgo.Dialer(d.DialContext) },
		func() kgo.Opt { return kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}) },
	} {
		dropped[fmt.Sprintf("made in a closure, %d", i)] = mk()
	}
	for name, o := range dropped {
		if !reachesCluster(o) {
			t.Errorf("%s: not recognized as the own cluster's address or security; it would reach the new channel", name)
		}
	}
	for name, o := range kept {
		if reachesCluster(o) {
			t.Errorf("%s: taken for the own cluster's address or security; the new channel would not get it", name)
		}
	}
	channel := []kgo.Opt{kgo.SeedBrokers("b:9092")}
	got := channelKafkaOpts([]kgo.Opt{dropped["SeedBrokers"], kept["SessionTimeout"], dropped["SASL"], kept["ClientID"]}, channel)
	if len(got) != 3 {
		t.Fatalf("channelKafkaOpts kept %d options, want the session timeout, the client id and the channel's brokers", len(got))
	}
	cl, err := kgo.NewClient(got...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if v := cl.OptValue(kgo.SessionTimeout); v != 6*time.Second {
		t.Errorf("session timeout %v, want the worker's 6s", v)
	}
	if v := cl.OptValue(kgo.ClientID); v != "billing" {
		t.Errorf("client id %v, want the worker's", v)
	}
	if v := cl.OptValues(kgo.SeedBrokers); len(v) != 1 || v[0].([]string)[0] != "b:9092" {
		t.Errorf("seed brokers %v, want the channel's", v)
	}
	if v, _ := cl.OptValue(kgo.SASL).([]sasl.Mechanism); len(v) != 0 {
		t.Errorf("SASL mechanisms %v, want none: the worker's own are not the channel's", v)
	}
}

// A worker whose own channel is cluster A through SASL_SSL, with a
// session timeout, a heartbeat and a client id of its own in KafkaOpts,
// learns from a fence a new channel on cluster B, through B's SASL_SSL
// listener with B's password. Its group there runs with the worker's
// settings (issue 21 item 4: it ran with franz-go's defaults, a 45 s
// session timeout among them), and with B's address and credentials,
// never A's: it applies a copy it consumed there.
func TestTheNewChannelsGroupTakesTheWorkersKafkaSettings(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, 2*time.Minute)
	secA, secB := ferrytest.Secure(t), ferrytest.SecureB(t)
	b := setup(t, 1)
	newTopic := ferrytest.TopicB(t, 1)
	ferrytest.CreateTopicB(t, newTopic+DeadLetterSuffixDefault, 1)
	tc, err := kafkaauth.TLS(kafkaauth.TLSFiles{CA: secA.CAFile}, kafkaauth.Names{CA: "ca"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := b.config()
	cfg.KafkaOpts = []kgo.Opt{
		kgo.SeedBrokers(secA.SASLSSLBrokers), kgo.DialTLSConfig(tc), kafkaauth.SASL("SCRAM-SHA-512", secA.User, secA.Password),
		kgo.FetchMaxWait(250 * time.Millisecond),
		kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(time.Second), kgo.ClientID("ferry-item-4"),
	}
	w := b.newWorker(cfg, effectHandler)
	b.start(w)

	ch := migration.Channel{Brokers: []string{secB.SASLSSLBrokers}, TopicTemplate: "unused.{aggregate_type}", TLS: true, TLSCAFile: secB.CAFile,
		SASLMechanism: "SCRAM-SHA-512", SASLUsername: secB.User, SASLPasswordEnv: ferrytest.EnvKafkaBSASLPassword}
	value, err := json.Marshal(ch)
	if err != nil {
		t.Fatal(err)
	}
	fence := route.Fence{Plan: "move", Epoch: 1, Side: migration.OldSide, Partitions: 1, Peer: newTopic}
	b.produce(&kgo.Record{Topic: b.topic, Partition: 0, Value: value,
		Headers: []kgo.RecordHeader{{Key: route.HeaderFence, Value: []byte(fence.String())}}})
	onB := b.stamped("m-on-b", migration.NewSide, route.Authoritative)
	onB.Topic = newTopic
	if err := ferrytest.ClientB(t).ProduceSync(ctx, onB).FirstErr(); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the copy on B applied", func() (bool, error) { return b.effects("m-on-b") == 1, nil })

	w.routeMu.Lock()
	g := w.followers[followKey{b.consumer, "move"}]
	w.routeMu.Unlock()
	if g == nil {
		t.Fatal("no group on the new channel")
	}
	for _, c := range []struct {
		name      string
		opt, want any
	}{
		{"session timeout", kgo.SessionTimeout, 6 * time.Second},
		{"heartbeat interval", kgo.HeartbeatInterval, time.Second},
		{"client id", kgo.ClientID, "ferry-item-4"},
		{"fetch max wait", kgo.FetchMaxWait, 250 * time.Millisecond},
	} {
		if got := g.kafka().OptValue(c.opt); got != c.want {
			t.Errorf("the new channel's group has %s %v, want the worker's %v", c.name, got, c.want)
		}
	}
	if seeds := g.kafka().OptValue(kgo.SeedBrokers).([]string); len(seeds) != 1 || seeds[0] != secB.SASLSSLBrokers {
		t.Errorf("the new channel's group reaches %v, want B's %s", seeds, secB.SASLSSLBrokers)
	}
}
