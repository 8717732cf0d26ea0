package inbox

// UnsafeCommitOffsetsBeforeDB makes a worker commit each message's Kafka
// offset before its database transaction, instead of after the commit. It
// breaks Ferry's consumer rule on purpose and loses effects when the worker
// crashes between the two: it exists only as the negative control of the
// fault-injection suite, which must see that loss. Never use it in
// production.
func UnsafeCommitOffsetsBeforeDB(cfg *Config) { cfg.unsafeCommitBeforeDB = true }

// UnsafeNoMigrationQuarantine keeps a worker from quarantining the events
// of a live migration whose shadow copy arrived and which it never applied
// (their authoritative copy lost): they stay unapplied and unaccounted, as
// with a consumer that leaves the old channel at cutover without a drain.
// It exists only as the negative control of the fault-injection suite,
// whose checker must report those events lost. Never use it in production.
func UnsafeNoMigrationQuarantine(cfg *Config) { cfg.unsafeNoMigrationQuarantine = true }

// UnsafePruneIgnoreDedupeWindow makes pruning delete inbox rows even when
// a live migration's measured cross-channel delay says duplicates can
// still arrive for them (see DedupeWindowError): a copy arriving later
// takes effect a second time. It exists only as the negative control of
// the dedupe window, whose test must see those double effects. Never use
// it in production.
func UnsafePruneIgnoreDedupeWindow(cfg *PruneConfig) { cfg.unsafeIgnoreWindow = true }
