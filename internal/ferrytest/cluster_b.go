package ferrytest

import (
	"os"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Environment variables of the stack's second Kafka cluster, B, printed by
// `scripts/stack up` (see scripts/stack). B is a single-node KRaft cluster
// of its own: another cluster id, other ports, other data. A topic made on
// one cluster does not exist on the other, and `scripts/stack kafka-b-stop`
// stops B alone. Its SASL_SSL listener takes the CA of EnvKafkaCAFile and
// the user of EnvKafkaBSASLUser with a password of its own.
const (
	EnvKafkaBBrokers        = "FERRY_TEST_KAFKA_B_BROKERS"
	EnvKafkaBSASLSSLBrokers = "FERRY_TEST_KAFKA_B_SASL_SSL_BROKERS"
	EnvKafkaBSASLUser       = "FERRY_TEST_KAFKA_B_SASL_USER"
	EnvKafkaBSASLPassword   = "FERRY_TEST_KAFKA_B_SASL_PASSWORD"
)

// BrokersB returns the seed brokers of the stack's second Kafka cluster, B,
// for tests that move traffic from one cluster (Brokers) to another.
func BrokersB(t testing.TB) []string {
	t.Helper()
	if testing.Short() {
		t.Skipf("integration test: skipped with -short")
	}
	v := os.Getenv(EnvKafkaBBrokers)
	if v == "" {
		t.Fatalf("%s is not set: run `make test`, or `eval \"$(scripts/stack up)\"` before go test "+
			"(a stack started before cluster B existed, or with FERRY_STACK_KAFKA_B=0, gets it from `scripts/stack kafka-b-start`)", EnvKafkaBBrokers)
	}
	return strings.Split(v, ",")
}

// ClientB is Client on cluster B.
func ClientB(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	return newClient(t, BrokersB(t), opts)
}

// AdminB is Admin on cluster B.
func AdminB(t testing.TB) *kadm.Client {
	t.Helper()
	return kadm.NewClient(ClientB(t))
}

// TopicB is Topic on cluster B: a topic of the test's own there, deleted
// when the test ends.
func TopicB(t testing.TB, partitions int32) string {
	t.Helper()
	name := strings.ReplaceAll(Name(t, "t"), "_", ".")
	createTopic(t, AdminB(t), name, partitions, nil)
	return name
}

// SecureB returns cluster B's SASL_SSL listener (B has no mutual-TLS one:
// MTLSBrokers and the client certificate are empty). Like every integration
// helper it skips with -short and fails without a stack.
func SecureB(t testing.TB) *SecureKafka {
	t.Helper()
	BrokersB(t)
	get := func(env string) string {
		t.Helper()
		v := os.Getenv(env)
		if v == "" {
			t.Fatalf("%s is not set: run `make test`, or `eval \"$(scripts/stack up)\"` before go test", env)
		}
		return v
	}
	return &SecureKafka{
		SASLSSLBrokers: get(EnvKafkaBSASLSSLBrokers),
		CAFile:         get(EnvKafkaCAFile),
		User:           get(EnvKafkaBSASLUser),
		Password:       get(EnvKafkaBSASLPassword),
	}
}

// CreateTopicB is CreateTopic on cluster B.
func CreateTopicB(t testing.TB, name string, partitions int32) {
	t.Helper()
	createTopic(t, AdminB(t), name, partitions, nil)
}
