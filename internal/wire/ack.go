package wire

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// Limits of an ack message, as PROTOCOL.md states them. The daemon also
// caps an ack's size in bytes, by configuration.
const (
	// MaxAckEntries caps the entries of one ack: its frames, keys and
	// nacks together.
	MaxAckEntries = 16384
	// MaxReasonBytes caps a nack's reason: DecodeAck keeps the first
	// MaxReasonBytes bytes of a longer one, cut at a character boundary.
	MaxReasonBytes = 1024
	// MaxAckDepth is the deepest nesting of an ack, the outer object
	// counting as 1: the limit of jsonscan.Decoder, which is
	// encoding/json's.
	MaxAckDepth = 10000
)

// DecodeAck parses an ack message and rejects it whole unless all of it
// follows PROTOCOL.md: valid UTF-8 holding one JSON object (RFC 8259, no
// byte-order mark, nothing after it, nested at most MaxAckDepth deep) with
// the number 1 in "v", "ack" in "type", and at least one and at most
// MaxAckEntries entries in "frames", "keys" and "nacks" together. Every
// known field must have its type; null is no type, so it is an error too,
// as is a repeated known field. Frame ids are integers from 1 up (no
// fraction, no exponent). Each key ack needs "frame", "source" and "key";
// each nack also needs "reason", while "permanent" is optional (false).
// Unknown fields are ignored at every level, and field names match
// exactly, not ignoring case as encoding/json does. A reason longer than
// MaxReasonBytes is truncated.
//
// An entry that is well formed but names no pending frame or event is not
// an error here: the queue counts it as unknown.
func DecodeAck(data []byte) (*Ack, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("decode ack: not valid UTF-8")
	}
	d := ackDecoder{a: new(Ack)}
	d.dec.Reset(data)
	err := d.dec.Object(d.ackField)
	if err == nil {
		err = d.dec.End()
	}
	a := d.a
	if d.seen&seenV != 0 && a.V != Version {
		// A newer version may shape its fields differently: say why
		// first.
		return nil, fmt.Errorf("decode ack: unsupported version %d (want %d)", a.V, Version)
	}
	if err != nil {
		return nil, fmt.Errorf("decode ack: %w", err)
	}
	switch {
	case d.seen&seenV == 0:
		return nil, errors.New("decode ack: no field v")
	case d.seen&seenType == 0:
		return nil, errors.New("decode ack: no field type")
	case a.Type != TypeAck:
		return nil, fmt.Errorf("decode ack: unexpected type %q", a.Type)
	case d.entries == 0:
		return nil, errors.New("decode ack: no frames, keys or nacks")
	}
	return a, nil
}

// Bits of ackDecoder.seen and of the fields seen in one entry.
const (
	seenV = 1 << iota
	seenType
	seenFrames
	seenKeys
	seenNacks
)

const (
	seenFrame = 1 << iota
	seenSource
	seenKey
	seenReason
	seenPermanent
)

// ackDecoder holds DecodeAck's state.
type ackDecoder struct {
	dec     jsonscan.Decoder
	a       *Ack
	seen    int // fields of the ack seen
	entries int // frames, keys and nacks decoded
	// entry is the key ack or nack being decoded, entrySeen its fields
	// seen and entryKnown the fields it has.
	entry      *Nack
	entrySeen  int
	entryKnown int
	source     lastString
}

// once records that field (one bit of *seen) occurred and fails if it
// already had.
func once(seen *int, bit int, field string) error {
	if *seen&bit != 0 {
		return &fieldError{Field: field, Msg: "repeated"}
	}
	*seen |= bit
	return nil
}

// ackField decodes the value of one member of the ack object.
func (d *ackDecoder) ackField(key []byte, plain bool) error {
	a := d.a
	name := string(keyText(key, plain))
	bit := ackFieldBit(name)
	if bit == 0 {
		return nil // an unknown field, skipped
	}
	if err := once(&d.seen, bit, name); err != nil {
		return err
	}
	switch bit {
	case seenV:
		return ackInt(&d.dec, &a.V, name, 0)
	case seenType:
		return decodeString(&d.dec, &a.Type, name, nullFails)
	case seenFrames:
		return d.list(name, func(i int) error {
			a.Frames = append(a.Frames, 0)
			err := ackInt(&d.dec, &a.Frames[i], "", 1)
			if fe, ok := err.(*fieldError); ok {
				fe.Field = fmt.Sprintf("frames[%d]", i)
			}
			return err
		})
	case seenKeys:
		return d.list(name, func(i int) error {
			var n Nack
			if err := d.entryObject(&n, name, i, seenFrame|seenSource|seenKey, seenFrame|seenSource|seenKey); err != nil {
				return err
			}
			a.Keys = append(a.Keys, KeyAck{Frame: n.Frame, Source: n.Source, Key: n.Key})
			return nil
		})
	default: // seenNacks
		return d.list(name, func(i int) error {
			var n Nack
			if err := d.entryObject(&n, name, i, seenFrame|seenSource|seenKey|seenReason, seenFrame|seenSource|seenKey|seenReason|seenPermanent); err != nil {
				return err
			}
			a.Nacks = append(a.Nacks, n)
			return nil
		})
	}
}

// ackFieldBit returns the bit of ackDecoder.seen that records the field
// of the ack object called name, and 0 for an unknown field.
func ackFieldBit(name string) int {
	switch name {
	case "v":
		return seenV
	case "type":
		return seenType
	case "frames":
		return seenFrames
	case "keys":
		return seenKeys
	case "nacks":
		return seenNacks
	}
	return 0
}

// list decodes the array value of field, calling elem for each element
// with its index, and enforces MaxAckEntries.
func (d *ackDecoder) list(field string, elem func(i int) error) error {
	if kind := d.dec.Peek(); kind != jsonscan.Array {
		return typeError(field, "an array", kind)
	}
	i := 0
	return d.dec.Array(func() error {
		if d.entries++; d.entries > MaxAckEntries {
			return fmt.Errorf("more than %d frames, keys and nacks", MaxAckEntries)
		}
		err := elem(i)
		i++
		return err
	})
}

// entryObject decodes element i of the keys or nacks array into n, reading
// the fields in known and skipping the others, and checks that the fields
// in need were all there.
func (d *ackDecoder) entryObject(n *Nack, list string, i int, need, known int) error {
	path := func() string { return fmt.Sprintf("%s[%d]", list, i) }
	if kind := d.dec.Peek(); kind != jsonscan.Object {
		return typeError(path(), "an object", kind)
	}
	d.entry, d.entrySeen, d.entryKnown = n, 0, known
	if err := d.dec.Object(d.entryField); err != nil {
		return within(err, path())
	}
	for _, f := range []struct {
		bit  int
		name string
	}{{seenFrame, "frame"}, {seenSource, "source"}, {seenKey, "key"}, {seenReason, "reason"}} {
		if need&f.bit != 0 && d.entrySeen&f.bit == 0 {
			return &fieldError{Field: path() + "." + f.name, Msg: "missing"}
		}
	}
	return nil
}

// entryField decodes the value of one member of a key ack or a nack.
func (d *ackDecoder) entryField(key []byte, plain bool) error {
	n := d.entry
	name := string(keyText(key, plain))
	bit := entryFieldBit(name)
	if bit&d.entryKnown == 0 {
		return nil // an unknown field, skipped
	}
	if err := once(&d.entrySeen, bit, name); err != nil {
		return err
	}
	switch bit {
	case seenFrame:
		return ackInt(&d.dec, &n.Frame, name, 1)
	case seenSource:
		return d.source.decode(&d.dec, &n.Source, name, nullFails)
	case seenKey:
		return decodeString(&d.dec, &n.Key, name, nullFails)
	case seenReason:
		if err := decodeString(&d.dec, &n.Reason, name, nullFails); err != nil {
			return err
		}
		n.Reason = truncateUTF8(n.Reason, MaxReasonBytes)
		return nil
	default: // seenPermanent
		val, kind, err := d.dec.Value()
		if err != nil {
			return err
		}
		if kind != jsonscan.Bool {
			return typeError(name, "true or false", kind)
		}
		n.Permanent = val[0] == 't'
		return nil
	}
}

// entryFieldBit returns the bit of ackDecoder.entrySeen that records the
// field of an entry called name, and 0 for an unknown field.
func entryFieldBit(name string) int {
	switch name {
	case "frame":
		return seenFrame
	case "source":
		return seenSource
	case "key":
		return seenKey
	case "reason":
		return seenReason
	case "permanent":
		return seenPermanent
	}
	return 0
}

// ackInt reads a JSON integer of at least least into *dst; null, a
// fraction or an exponent are errors.
func ackInt[T integer](dec *jsonscan.Decoder, dst *T, field string, least int64) error {
	if err := decodeInt(dec, dst, field, nullFails); err != nil {
		return err
	}
	if int64(*dst) < least {
		return &fieldError{Field: field, Msg: fmt.Sprintf("%d is below %d", *dst, least)}
	}
	return nil
}

// truncateUTF8 returns the longest prefix of s of at most n bytes that
// does not split a UTF-8 sequence.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
