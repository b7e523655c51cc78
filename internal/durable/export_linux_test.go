package durable

// SyncThreads returns how many sync threads were started and how many are
// idle.
func SyncThreads() (started, idle int) { return len(syncerSlots), len(idleSyncers) }
