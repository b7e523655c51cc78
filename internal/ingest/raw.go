package ingest

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/telemetry"
)

// Ref locates a payload in the raw store: the key of the object that holds
// it (a page segment or an object of its own) and the payload's offset in
// it (past its record header in a page segment, 0 in an object).
type Ref struct {
	Key string
	Off int
}

// Payload is raw bytes on their way to the raw store: a page (Page), a
// malformed payload (DeadLetter), or bytes kept elsewhere under a key
// given earlier (Object). Write makes it durable; Ref then says where.
type Payload struct {
	// Source is the source the bytes came from.
	Source string
	// Body is the bytes, as fetched or pushed; never copied.
	Body      []byte
	fetchedAt time.Time
	// page is set for a page the store appends to its source's page
	// segment: ref is known once written. Otherwise ref.Key is the
	// object's key from the start.
	page bool
	ref  Ref
}

// deadLetterPrefix starts the keys of malformed payloads.
const deadLetterPrefix = "deadletter/"

// Page returns body, a page of source fetched at fetchedAt (a polled
// batch, or a group of pushed bodies), to be made durable the way the raw
// store keeps pages: appended to the source's open page segment where the
// store appends pages, else an object of its own under its content key.
func (in *Ingest) Page(source string, fetchedAt time.Time, body []byte) Payload {
	p := Payload{Source: source, Body: body, fetchedAt: fetchedAt}
	if _, ok := in.o.Raw.(rawstore.PageAppender); ok {
		p.page = true
	} else {
		p.ref.Key = rawstore.Key(source, fetchedAt, body)
	}
	return p
}

// DeadLetter returns body, a malformed payload of source fetched at
// fetchedAt, to be kept as an object under deadletter/ and then listed
// (RecordDeadLetter).
func DeadLetter(source string, fetchedAt time.Time, body []byte) Payload {
	return Payload{Source: source, Body: body, fetchedAt: fetchedAt,
		ref: Ref{Key: deadLetterPrefix + rawstore.Key(source, fetchedAt, body)}}
}

// Object returns body, kept elsewhere under key (a spilled payload, named
// by its ObjectKey), to be written back as an object under that key.
func Object(source, key string, body []byte) Payload {
	return Payload{Source: source, Body: body, ref: Ref{Key: key}}
}

// Ref returns where p is in the raw store: for a page to append, only
// once Write succeeded, or once WriteCommit reserved its place (the zero
// Ref before).
func (p *Payload) Ref() Ref { return p.ref }

// ObjectKey returns the key p has as an object of its own: its Ref's key,
// or for a page to append the key the store would give it as an object.
// A payload kept outside the raw store (a spill dir) is kept under it, and
// written back with Object.
func (p *Payload) ObjectKey() string {
	if p.page {
		return rawstore.Key(p.Source, p.fetchedAt, p.Body)
	}
	return p.ref.Key
}

// errNoRawStore is Write's error on an Ingest without a raw store.
var errNoRawStore = errors.New("no raw store to write to")

// Write makes p durable in the raw store (on the file store, written and
// fsynced) and sets its Ref; it is one attempt, with no retry. A failed
// write is shown to the disk guard (IsDiskFull). Writing an object again
// stores the same bytes under the same key; a page written again is
// appended again, and only the last Ref is referenced.
func (in *Ingest) Write(ctx context.Context, p *Payload) (err error) {
	if in.o.Raw == nil {
		return errNoRawStore
	}
	ctx, span := telemetry.Child(ctx, in.o.Tracer, "raw write", trace.WithAttributes(
		attribute.String("ingestor.source", p.Source), attribute.Int("ingestor.bytes", len(p.Body))))
	defer func() { telemetry.End(span, err) }()
	if app, ok := in.o.Raw.(rawstore.PageAppender); ok && p.page {
		var ref Ref
		if ref.Key, ref.Off, err = app.AppendPage(ctx, p.Source, p.fetchedAt, p.Body); err == nil {
			p.ref = ref
		}
	} else {
		err = in.o.Raw.Put(ctx, p.ref.Key, p.Body)
	}
	if err != nil {
		return in.failed(err)
	}
	return nil
}

// RecordDeadLetter lists p, a malformed payload Write kept, in the queue's
// dead letters with the reason it did not parse and the cursor it was
// fetched with; the same bytes listed again count on their entry.
func (in *Ingest) RecordDeadLetter(ctx context.Context, p *Payload, reason, cursor string) error {
	if err := in.o.Queue.DeadLetter(ctx, p.Source, reason, p.ref.Key, cursor); err != nil {
		return in.failed(err)
	}
	return nil
}
