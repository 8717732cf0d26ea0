package demo

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/inbox"
)

func TestCountDeadLettersBreaksMessagesDownByReason(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	dl := func(id, consumer string, reason inbox.DeadLetterReason, s int) inbox.DeadLetter {
		return inbox.DeadLetter{ID: id, Consumer: consumer, Reason: reason, Error: string(reason) + " " + id, FailedAt: at.Add(time.Duration(s) * time.Second)}
	}
	c := countDeadLetters([]inbox.DeadLetter{
		dl("a", "stock", inbox.ReasonUndecodable, 0),
		dl("b", "stock", inbox.ReasonPermanent, 1),
		dl("a", "stock", inbox.ReasonUndecodable, 2),       // redelivered after a kill
		dl("b", "status", inbox.ReasonRetriesExhausted, 3), // a second consumer, another reason
		{Reason: inbox.ReasonMissingID, OriginalOffset: 7}, // no id: a message of its own
		{Reason: inbox.ReasonMissingID, OriginalOffset: 8},
	})
	if c.messages != 4 || c.records != 6 {
		t.Fatalf("messages %d, records %d; want 4 and 6", c.messages, c.records)
	}
	sum := 0
	for _, r := range c.reasons() {
		sum += c.byReason[r]
	}
	if sum != c.messages {
		t.Errorf("reasons add up to %d, want %d messages: %v", sum, c.messages, c.byReason)
	}
	if c.byReason[inbox.ReasonPermanent] != 1 || c.byReason[inbox.ReasonRetriesExhausted] != 0 {
		t.Errorf("a message counts under the reason of its first dead letter: %v", c.byReason)
	}
	if c.again != 1 || c.byOther != 1 || c.extra() == "" {
		t.Errorf("again %d, by another consumer %d, extra %q; want 1, 1 and a line", c.again, c.byOther, c.extra())
	}
}

func TestCountDeadLettersOneRecordEachNeedsNoExplanation(t *testing.T) {
	t.Parallel()
	c := countDeadLetters([]inbox.DeadLetter{{ID: "a", Reason: inbox.ReasonPermanent}, {ID: "b", Reason: inbox.ReasonPermanent}})
	if c.messages != 2 || c.records != 2 || c.extra() != "" {
		t.Errorf("messages %d, records %d, extra %q; want 2, 2 and none", c.messages, c.records, c.extra())
	}
}
