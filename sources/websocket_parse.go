package sources

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// Parse implements Parser: body is a batch Body, a JSON array of messages.
func (w *wsSource) Parse(body []byte, fetchedAt time.Time) (*Batch, error) {
	spans, err := jsonscan.SplitArray(body)
	if err != nil {
		return nil, &MalformedError{Body: body, FetchedAt: fetchedAt, Reason: "not a JSON array of messages: " + err.Error()}
	}
	b := &Batch{Body: body, FetchedAt: fetchedAt}
	for i, sp := range spans {
		start := len(b.Records)
		if b.Records, err = w.parser.records(b.Records, body[sp.Off:sp.Off+sp.Len]); err != nil {
			return nil, &MalformedError{Body: body, FetchedAt: fetchedAt, Reason: fmt.Sprintf("message %d: %v", i, err)}
		}
		for j := start; j < len(b.Records); j++ {
			b.Records[j].Off += sp.Off
		}
	}
	return b, nil
}

// wsParser finds the records in a message.
type wsParser struct {
	idField, cursorField, timeField, recordsPath string
}

// records validates msg, one JSON value, and appends its records to dst,
// with Off relative to msg.
func (p wsParser) records(dst []Record, msg []byte) ([]Record, error) {
	var d jsonscan.Decoder
	d.Reset(msg)
	if p.recordsPath == "" && d.Peek() == jsonscan.Array {
		err := d.Array(func() error {
			start := d.Offset()
			if _, _, err := d.Value(); err != nil {
				return err
			}
			dst = p.record(dst, msg, start, d.Offset())
			return nil
		})
		if err == nil {
			err = d.End()
		}
		return dst, err
	}
	start := d.Offset() // Peek skipped any leading space
	if _, _, err := d.Value(); err != nil {
		return dst, err
	}
	if err := d.End(); err != nil {
		return dst, err
	}
	if p.recordsPath == "" {
		return p.record(dst, msg, start, d.Offset()), nil
	}
	val, kind, ok := jsonscan.Field(msg, p.recordsPath)
	if !ok || kind == jsonscan.Null {
		return dst, nil // a message without records, such as an ack
	}
	// val aliases msg, so the capacities tell where it starts.
	base := cap(msg) - cap(val)
	switch kind {
	case jsonscan.Object:
		return p.record(dst, msg, base, base+len(val)), nil
	case jsonscan.Array:
		spans, err := jsonscan.SplitArray(val)
		if err != nil {
			return dst, err // cannot happen: msg was validated
		}
		for _, sp := range spans {
			dst = p.record(dst, msg, base+sp.Off, base+sp.Off+sp.Len)
		}
		return dst, nil
	}
	return dst, fmt.Errorf("records_path %q holds a %s, want an array or an object", p.recordsPath, kind)
}

// record appends the record msg[start:end] to dst.
func (p wsParser) record(dst []Record, msg []byte, start, end int) []Record {
	rec := msg[start:end]
	r := Record{Off: start, Len: end - start, Cursor: scalarField(rec, p.cursorField)}
	if r.Key = scalarField(rec, p.idField); r.Key == "" {
		sum := sha256.Sum256(rec)
		r.Key = hex.EncodeToString(sum[:])
	}
	if ts := scalarField(rec, p.timeField); ts != "" {
		if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			r.Time = t
		}
	}
	return append(dst, r)
}
