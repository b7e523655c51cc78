package actors

import (
	"time"

	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/sources"
)

// pollTick asks a SourceActor to fetch, if its window allows.
type pollTick struct{ gen uint64 }

// fetchDone carries a fetch's outcome back to its SourceActor.
type fetchDone struct {
	gen   uint64
	batch *sources.Batch
	err   error
	// panicked is set when the fetch panicked; the actor then fails so that
	// its supervisor restarts it.
	panicked any
	// cursor is the cursor the fetch was made with: its request.
	cursor string
}

// persistRaw asks PersistRaw to make a batch's payload durable.
type persistRaw struct {
	gen    uint64
	seq    uint64
	source string
	batch  *sources.Batch
	// abandon closes when the source drains: a write failing by then is
	// not retried (errRawAbandoned).
	abandon <-chan struct{}
}

// rawPersisted is PersistRaw's reply to persistRaw.
type rawPersisted struct {
	gen uint64
	seq uint64
	// raw is where the batch's body is in the raw store.
	raw ingest.Ref
	err error
}

// deadLetterPayload asks PersistRaw to keep a malformed payload and record
// it in the dead-letter list. It holds a slot of its source's window until
// PersistRaw answers with deadLettered.
type deadLetterPayload struct {
	gen    uint64
	source string
	cursor string // the cursor the payload was fetched with
	err    *sources.MalformedError
	// abandon closes when the source drains: a write failing by then is
	// not retried (errRawAbandoned), and the payload is not kept.
	abandon <-chan struct{}
}

// deadLettered is PersistRaw's reply to deadLetterPayload: the payload is
// in the raw store and listed, or PersistRaw is stopping.
type deadLettered struct {
	gen    uint64
	cursor string
}

// appendBatch asks the Publisher to commit a slice of a durable batch
// and send it: records, at most sources.SliceRecords of the batch's, with
// the batch's cursor when it is the last slice.
type appendBatch struct {
	// chain orders the batches of one source incarnation in the queue.
	chain   *queue.Chain
	gen     uint64
	seq     uint64
	source  string
	raw     ingest.Ref // where the batch's body is in the raw store
	batch   *sources.Batch
	records []sources.Record
	last    bool
}

// batchCommitted is the Publisher's reply to appendBatch.
type batchCommitted struct {
	gen       uint64
	seq       uint64
	records   []sources.Record // the slice committed
	newEvents int
	err       error
}

// cursorRead carries a SourceActor's durable cursor and not-before time
// (zero when none), read from the queue when it starts, back to it.
type cursorRead struct {
	gen       uint64
	cursor    string
	notBefore time.Time
	err       error
}

// drainRequest asks a SourceActor to stop fetching, cancelling a fetch in
// progress, and answer with drained once every batch it fetched is
// committed.
type drainRequest struct {
	// finishFetch lets a fetch in progress finish and commit instead of
	// cancelling it (a cluster hand-over).
	finishFetch bool
}

// drained answers drainRequest.
type drained struct{ source string }

// failed makes an actor fail on its own goroutine, so the supervisor sees it.
type failed struct{ reason any }
