package migration_test

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/migration"
)

// A channel with TLS and SCRAM reaches cluster B's SASL_SSL listener with
// the password from the variable it names; without the variable it is an
// error that names the variable and shows no secret.
func TestChannelReachesASecureCluster(t *testing.T) {
	t.Parallel()
	sec := ferrytest.SecureB(t)
	ctx := ferrytest.Context(t, time.Minute)
	ch := migration.Channel{Brokers: strings.Split(sec.SASLSSLBrokers, ","), TopicTemplate: "t.{aggregate_type}",
		TLS: true, TLSCAFile: sec.CAFile, SASLMechanism: "SCRAM-SHA-512", SASLUsername: sec.User, SASLPasswordEnv: "NEW_PASS"}
	env := map[string]string{"NEW_PASS": sec.Password}
	opts, err := ch.KafkaOpts("new", func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil {
		t.Fatalf("ping through the channel's options: %v", err)
	}

	_, err = ch.KafkaOpts("new", func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "NEW_PASS") || strings.Contains(err.Error(), sec.Password) {
		t.Fatalf("missing password variable: %v", err)
	}
}

// A channel names the topics its template fills, and no other.
func TestChannelNamesTheTopicsOfItsTemplate(t *testing.T) {
	t.Parallel()
	c := migration.Channel{TopicTemplate: "shop.{aggregate_type}.v2"}
	for topic, want := range map[string]bool{
		"shop.order.v2": true, "shop.order.item.v2": true, "shop..v2": false, "shop.order.v1": false,
		"shop.order.v2.dlq": false, "xshop.order.v2": false,
	} {
		if got := c.Names(topic); got != want {
			t.Errorf("Names(%q) = %t, want %t", topic, got, want)
		}
	}
	if !(migration.Channel{TopicTemplate: "fixed"}).Names("fixed") || (migration.Channel{TopicTemplate: "fixed"}).Names("fixed2") {
		t.Error("a template without placeholders names itself only")
	}
}
