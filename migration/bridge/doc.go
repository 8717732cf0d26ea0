// Package bridge moves the records of producers that are not Ferry's from
// a migration's old channel to its new one, while both run.
//
// Ferry's relay writes Ferry's own events to both channels of a migration
// (see package migration). Other producers writing to the old cluster do
// not: a Bridge reads their topics there, with a consumer group of its own
// (GroupPrefix + the plan's name unless told otherwise), and publishes
// every record to the new channel's cluster with the same key, value,
// timestamp and headers, on the same topic name or one given by
// Config.TopicMap and Config.TopicTemplate.
//
// # Ids
//
// Consumers deduplicate on the record's id (the outbox.HeaderID header),
// so a copy must carry the id the original had, on every copy ever made
// of it. A record that has an id keeps it (Config.IDHeader names another
// header to take it from). A record that has none gets a derived id: a
// SHA-256 of its key and value, the same on every run and on both
// clusters, and the same a worker derives with
// inbox.Config.IDFromPayloadHash. Two distinct messages with identical
// key and value then share an id, and consumers apply only one of them;
// producers whose messages can repeat byte for byte need an id header of
// their own. An id is never made from an offset: the offset of a record
// differs between the clusters and between a replay and the original.
//
// # Order and loss
//
// The records of one old partition are sent in their order to franz-go's
// idempotent producer (acknowledged by every in-sync replica, order kept
// per partition, retried without limit), partitioned by key, so the
// records of a key stay in one new partition in their old order. An old
// offset is committed only when the new cluster acknowledged that record
// and every earlier one of its partition (autocommit is off; the offsets
// are committed every Config.CommitInterval, and when partitions are
// given up in a rebalance or at shutdown). A crash, a rebalance or an outage of the new cluster
// can therefore publish a record twice, which its id makes harmless, and
// never loses one. A record the new cluster refuses for good (too large,
// no such topic, not authorized) is not skipped: Run stops with a
// *RefusedError naming its topic, partition and offset, and resumes there
// when started again after the cause is fixed.
//
// # Route stamps
//
// Every copy carries a route stamp (the ferry.route header), in place of
// any the record had: the plan, the epoch of the plan's current step, the
// aggregate's slice (the stable hash of the record key into one of
// migration.Slices), side new, and role authoritative, in every phase that
// writes the new channel. A
// bridged copy is the original byte for byte, and the original on the old
// channel carries no stamp, so a consumer applies both on sight and its
// inbox keeps the first: each channel brings a key's records in their
// order, and a record is applied only once its predecessor was (in one
// copy or the other), so each key's order holds across the channels
// without fences. (Were the copies shadows until their slice moved, a
// moved key's new copy could be applied while its predecessor still waited
// on a lagging old channel.) Since and peer stay empty, and the bridge
// writes no fences: it never writes to the old cluster, whose topics other
// consumers read. There is nothing to compare either: the shadow gate's
// evidence comes from Ferry's own events. The bridge reads the step from
// PostgreSQL every Config.StepInterval; its switch points are "when the
// bridge read the step", not a point of the producer's commit order as for
// Ferry's relay: the producers are not Ferry's. While the plan is OLD_ONLY
// the bridge waits: it reads nothing, publishes nothing and commits
// nothing; a plan taken back to OLD_ONLY makes it leave its group and wait
// again.
package bridge
