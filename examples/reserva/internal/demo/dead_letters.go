package demo

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"

	"github.com/ferryhq/ferry/inbox"
)

// deadLetterCount tells dead-lettered messages from dead-letter records. A
// message can be dead-lettered more than once: by two consumers, or again by
// the same one when it comes back because the worker was killed (or lost
// the partition) after writing the dead letter and before committing the
// offset. Redriving either record applies the message once.
type deadLetterCount struct {
	messages int
	records  int
	// byReason counts messages by the reason of their first dead letter,
	// so it adds up to messages; example is one error for each reason.
	byReason map[inbox.DeadLetterReason]int
	example  map[inbox.DeadLetterReason]string
	// again counts records beyond a message's first from a consumer that
	// had dead-lettered it already; byOther those from another consumer.
	again, byOther int
}

func countDeadLetters(dls []inbox.DeadLetter) deadLetterCount {
	dls = append([]inbox.DeadLetter(nil), dls...)
	sort.SliceStable(dls, func(i, j int) bool { return dls[i].FailedAt.Before(dls[j].FailedAt) })
	c := deadLetterCount{records: len(dls), byReason: map[inbox.DeadLetterReason]int{}, example: map[inbox.DeadLetterReason]string{}}
	consumers := map[string]map[string]bool{} // message -> consumers that dead-lettered it
	for _, dl := range dls {
		key := dl.ID
		if key == "" { // no id to tell copies apart: each record is a message
			key = dl.OriginalTopic + "/" + strconv.Itoa(int(dl.OriginalPartition)) + "/" + strconv.FormatInt(dl.OriginalOffset, 10)
		}
		seen, ok := consumers[key]
		switch {
		case !ok:
			consumers[key] = map[string]bool{dl.Consumer: true}
			c.messages++
			c.byReason[dl.Reason]++
			if _, ok := c.example[dl.Reason]; !ok {
				c.example[dl.Reason] = dl.Error
			}
		case seen[dl.Consumer]:
			c.again++
		default:
			seen[dl.Consumer] = true
			c.byOther++
		}
	}
	return c
}

// reasons returns the reasons in alphabetical order.
func (c deadLetterCount) reasons() []inbox.DeadLetterReason {
	return slices.Sorted(maps.Keys(c.byReason))
}

// extra explains, in one short line, why there are more records than
// messages; it is "" when there are not.
func (c deadLetterCount) extra() string {
	switch {
	case c.again > 0 && c.byOther > 0:
		return fmt.Sprintf("%d more than messages: %d from a second consumer, %d written again after a redelivery", c.again+c.byOther, c.byOther, c.again)
	case c.byOther > 0:
		return fmt.Sprintf("%d more than messages: dead-lettered by a second consumer too", c.byOther)
	case c.again > 0:
		return fmt.Sprintf("%d more than messages: written again when the message was redelivered before its offset was committed", c.again)
	}
	return ""
}
