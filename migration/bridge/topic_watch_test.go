package bridge_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/migration"
)

// A topic to copy that the old cluster does not have is said, at every
// check until it exists, in the logs, in Stats and by Ready; the topics
// that exist are copied meanwhile. Once it is created, Ready passes and
// its records are copied.
func TestATopicThatDoesNotExistIsSaidUntilItDoes(t *testing.T) {
	t.Parallel()
	b := setup(t, opts{oldPartitions: 1})
	b.request(migration.DualWrite, 0)
	missing := b.oldTopic + ".later"
	cfg := b.cfg
	cfg.Topics = append(slices.Clone(cfg.Topics), missing)
	cfg.TopicMap = map[string]string{b.oldTopic: b.newTopic, missing: b.newTopic}
	cfg.TopicCheckInterval = 100 * time.Millisecond
	r := b.start(cfg)
	b.produce(keyed(1, 1)...)
	b.waitFor("the existing topic's record copied", func() bool { return b.onB() == 1 })
	b.waitFor("two checks saying "+missing+" does not exist", func() bool {
		n := 0
		for _, line := range strings.Split(b.logs.String(), "\n") {
			if strings.Contains(line, `"level":"ERROR"`) && strings.Contains(line, "do not exist") && strings.Contains(line, `"`+missing+`"`) {
				n++
			}
		}
		return n >= 2
	})
	if err := r.Ready(); err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Ready() = %v, want an error saying %s does not exist", err, missing)
	}
	if got := r.Stats().MissingTopics; !slices.Equal(got, []string{missing}) {
		t.Fatalf("Stats().MissingTopics = %q, want [%s]", got, missing)
	}

	ferrytest.CreateTopic(t, missing, 1)
	b.waitFor("Ready once "+missing+" exists", func() bool { return r.Ready() == nil })
	if got := r.Stats().MissingTopics; len(got) != 0 {
		t.Fatalf("Stats().MissingTopics = %q once it exists, want none", got)
	}
	if !strings.Contains(b.logs.String(), "exists on the old channel now") {
		t.Fatalf("no log line says %s exists now:\n%s", missing, b.logs.String())
	}
	late := keyed(1, 1)[0]
	late.Topic = missing
	if err := ferrytest.Client(t).ProduceSync(b.ctx, late).FirstErr(); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the record of the topic created late copied", func() bool { return b.onB() == 2 })
}
