package ingest

import (
	"errors"

	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
)

// DiskGuard says when disk space is too low for new work
// (internal/diskspace.Guard).
type DiskGuard interface {
	// Low reports whether new work must wait for space, and why.
	Low() (reason string, low bool)
	// Failed takes note of a write's error and reports whether it failed
	// for lack of space.
	Failed(err error) bool
}

// Sender takes the frames of new events for delivery to processors
// (internal/delivery.Sender).
type Sender interface {
	Submit(frames []queue.Frame)
}

// Options configure an Ingest.
type Options struct {
	// Queue is the write-ahead queue the events commit to.
	Queue *queue.Queue
	// Raw is the raw store the payloads are written to; nil for a caller
	// whose payloads are in it already (replay), which then never calls
	// Write.
	Raw rawstore.Store
	// Sender takes the frames of the new events; nil leaves them queued
	// for the daemon to send when it starts (replay).
	Sender Sender
	// Disk, when set, says when new work must wait for space (DiskLow) and
	// is shown every write that fails.
	Disk DiskGuard
	// Tracer, when set, traces the raw writes and commits of traced
	// batches (those whose context, or Traceparent, is sampled).
	Tracer trace.Tracer
	// Tap, when set, sees the frames of every commit (internal/tap.Hub).
	Tap Tap
}

// Tap sees the frames of every commit once they are durable, before they
// go to the sender (internal/tap.Hub, behind `ingestor tap`). Committed
// runs on the commit path: it must not block, nor keep the frames.
type Tap interface {
	Committed(frames []queue.Frame)
}

// Ingest makes batches durable: their raw bytes, then their events. Its
// methods are safe for concurrent use.
type Ingest struct {
	o Options
}

// New returns an Ingest over o's queue, raw store, sender and disk guard.
func New(o Options) *Ingest {
	return &Ingest{o: o}
}

// DiskLow reports whether new work must wait for disk space, and why:
// sources pause their polls and push sources refuse while it does. It is
// cheap (an atomic load, a statfs at most every 100 ms).
func (in *Ingest) DiskLow() (reason string, low bool) {
	if in.o.Disk == nil {
		return "", false
	}
	return in.o.Disk.Low()
}

// fullError is the error of a write the disk guard took for lack of space.
type fullError struct{ err error }

func (e *fullError) Error() string { return e.err.Error() }
func (e *fullError) Unwrap() error { return e.err }

// IsDiskFull reports whether err, returned by Write, Commit, TryCommit's
// done or RecordDeadLetter, is a write that failed for lack of space: the
// disk guard was told, and new work waits until space returns.
func IsDiskFull(err error) bool {
	var f *fullError
	return errors.As(err, &f)
}

// failed shows err, a failed write's, to the disk guard, and marks it for
// IsDiskFull when it failed for lack of space.
func (in *Ingest) failed(err error) error {
	if in.o.Disk != nil && in.o.Disk.Failed(err) {
		return &fullError{err: err}
	}
	return err
}
