package inbox

// UnsafeCommitOffsetsBeforeDB makes a worker commit each message's Kafka
// offset before its database transaction, instead of after the commit. It
// breaks Ferry's consumer rule on purpose and loses effects when the worker
// crashes between the two: it exists only as the negative control of the
// fault-injection suite, which must see that loss. Never use it in
// production.
func UnsafeCommitOffsetsBeforeDB(cfg *Config) { cfg.unsafeCommitBeforeDB = true }
