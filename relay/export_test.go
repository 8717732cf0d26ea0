package relay

// InjectSlotFault makes the recoveries of a relay built from cfg run
// fault(attempt)'s statement on their replication connection in place of
// their attempt-th CREATE_REPLICATION_SLOT, when it returns one: the
// server's own error, delivered as a refused command would be.
func InjectSlotFault(cfg *Config, fault func(attempt int) string) { cfg.slotFault = fault }
