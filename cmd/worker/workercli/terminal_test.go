package workercli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// `worker dlq list` shows a dead letter's headers without handing their
// control and escape bytes to the terminal: they are escaped. A 10 KB id
// is cut, so that the table stays a table.
func TestDeadLetterListEscapesHeaders(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	topic := ferrytest.Topic(t, 1)
	dlq := topic + ".dlq"
	ferrytest.CreateTopic(t, dlq, 1)
	brokers := strings.Join(ferrytest.Brokers(t), ",")
	longID := "id-\x1b]0;pwned\x07" + strings.Repeat("x", 10_000)
	now := time.Now().UTC()
	rec := &kgo.Record{Topic: dlq, Key: []byte("k"), Value: []byte("v"), Headers: []kgo.RecordHeader{
		{Key: "id", Value: []byte(longID)},
		{Key: inbox.HeaderDeadLetterReason, Value: []byte(inbox.ReasonPermanent + "\x1b[2J")},
		{Key: inbox.HeaderDeadLetterError, Value: []byte("no such order\x1b[31m\r\nFAKE\tLINE")},
		{Key: inbox.HeaderDeadLetterAttempts, Value: []byte("1")},
		{Key: inbox.HeaderDeadLetterOriginalTopic, Value: []byte(topic)},
		{Key: inbox.HeaderDeadLetterOriginalPartition, Value: []byte("0")},
		{Key: inbox.HeaderDeadLetterOriginalOffset, Value: []byte("7")},
		{Key: inbox.HeaderDeadLetterOriginalTimestamp, Value: []byte(now.Add(-time.Minute).Format(time.RFC3339Nano))},
		{Key: inbox.HeaderDeadLetterConsumer, Value: []byte("billing\x1b]0;pwned\x07")},
		{Key: inbox.HeaderDeadLetterFailedAt, Value: []byte(now.Format(time.RFC3339Nano))},
	}}
	if err := ferrytest.Client(t).ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run(ctx, nil, "dlq", "list", "--topic", dlq, "--kafka-brokers", brokers)
	if code != 0 || !strings.Contains(stdout, "1 dead letters") {
		t.Fatalf("dlq list: exit %d\n%s\n%s", code, stdout, stderr)
	}
	for i, line := range strings.Split(stdout, "\n") {
		if len(line) > 600 {
			t.Errorf("line %d is %d bytes long, want at most 600: %.200q...", i+1, len(line), line)
		}
		for _, r := range line {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
				t.Errorf("line %d holds the raw control character %U: %.200q", i+1, r, line)
				break
			}
		}
	}
	for _, want := range []string{`id-\x1b]0;pwned\a`, `billing\x1b]0;pwned\a`, `no such order\x1b[31m\r\nFAKE\tLINE`, string(inbox.ReasonPermanent) + `\x1b[2J`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the list does not show %s escaped:\n%.2000s", want, stdout)
		}
	}
}
