package outbox

// recordBatchBytes is the size Kafka checks against a topic's
// max.message.bytes for a batch that holds ev's record alone, as the relay
// makes it: key = aggregate id, value = payload, headers = Ferry's four
// (HeaderID and friends) then the event's own. A record too large to share
// a batch travels alone, so this is the size that decides whether Kafka
// accepts it. The relay's records and this count must change together;
// relay's TestLargestEventTheWriterAcceptsIsPublished checks them against
// the broker at the byte.
func recordBatchBytes(ev *Event) int {
	const (
		batchHeader = 61 // base offset and batch length (12), then 49 bytes of batch fields
		idLen       = 36 // canonical UUID text in the id header
	)
	n := 1 + 1 + 1 // attributes, timestamp delta and offset delta: 0 for a batch's first record
	n += bytesField(len(ev.AggregateID)) + bytesField(len(ev.Payload))
	n += varintLen(len(ReservedHeaders) + len(ev.Headers))
	n += bytesField(len(HeaderID)) + bytesField(idLen)
	n += bytesField(len(HeaderEventType)) + bytesField(len(ev.EventType))
	n += bytesField(len(HeaderAggregateType)) + bytesField(len(ev.AggregateType))
	n += bytesField(len(HeaderAggregateID)) + bytesField(len(ev.AggregateID))
	for k, v := range ev.Headers {
		n += bytesField(len(k)) + bytesField(len(v))
	}
	return batchHeader + varintLen(n) + n
}

// bytesField is the encoded size of n bytes behind their varint length.
func bytesField(n int) int { return varintLen(n) + n }

// varintLen is the size of n as a Kafka (zigzag) varint.
func varintLen(n int) int {
	u := uint64(n) << 1
	size := 1
	for u >= 0x80 {
		u >>= 7
		size++
	}
	return size
}
