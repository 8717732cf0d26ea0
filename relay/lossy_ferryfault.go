//go:build ferryfault

package relay

import (
	"hash/fnv"
	"log/slog"
	"os"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/outbox"
)

// A relay built with the ferryfault tag can be given a lossy new channel
// for a live migration's negative controls: with
// FERRY_FAULT_DROP_NEW_PERCENT=n (1 to 100), n% of the authoritative
// copies it writes to a plan's new channel while the old channel still
// carries their shadow copy (the slices moved in CUTOVER) are acknowledged
// at once and never written. Which ones depends only on the event's id, so
// a copy published again is dropped again. Each drop is logged at WARN
// with its id ("ferryfault: dropped"), for the suite's checker.
func init() {
	v := os.Getenv("FERRY_FAULT_DROP_NEW_PERCENT")
	if v == "" {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 100 {
		panic("FERRY_FAULT_DROP_NEW_PERCENT=" + v + ": want a whole percentage from 1 to 100")
	}
	faultDrop = func(r *kgo.Record, log *slog.Logger) bool {
		var id, stamp string
		for _, h := range r.Headers {
			switch h.Key {
			case outbox.HeaderID:
				id = string(h.Value)
			case route.HeaderRoute:
				stamp = string(h.Value)
			}
		}
		st, err := route.ParseStamp(stamp)
		if stamp == "" || err != nil || st.Side != migration.NewSide || st.Role != route.Authoritative || st.Since == 0 {
			return false
		}
		h := fnv.New32a()
		h.Write([]byte(id))
		if h.Sum32()%100 >= uint32(n) {
			return false
		}
		log.Warn("ferryfault: dropped", slog.String("id", id), slog.String("topic", r.Topic))
		return true
	}
}
