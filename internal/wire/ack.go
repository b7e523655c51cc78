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
	// entry is the key ack or nack being decoded, and entrySeen its
	// fields seen.
	entry     *Nack
	entrySeen int
	source    lastString
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
	switch name := string(keyText(key, plain)); name {
	case "v":
		if err := once(&d.seen, seenV, name); err != nil {
			return err
		}
		return ackInt(&d.dec, &a.V, name, 0)
	case "type":
		if err := once(&d.seen, seenType, name); err != nil {
			return err
		}
		return decodeString(&d.dec, &a.Type, name, nullFails)
	case "frames":
		if err := once(&d.seen, seenFrames, name); err != nil {
			return err
		}
		return d.list(name, func(i int) error {
			a.Frames = append(a.Frames, 0)
			err := ackInt(&d.dec, &a.Frames[i], "", 1)
			if fe, ok := err.(*fieldError); ok {
				fe.Field = fmt.Sprintf("frames[%d]", i)
			}
			return err
		})
	case "keys":
		if err := once(&d.seen, seenKeys, name); err != nil {
			return err
		}
		return d.list(name, func(i int) error {
			var n Nack
			if err := d.entryObject(&n, name, i, seenFrame|seenSource|seenKey, d.keyField); err != nil {
				return err
			}
			a.Keys = append(a.Keys, KeyAck{Frame: n.Frame, Source: n.Source, Key: n.Key})
			return nil
		})
	case "nacks":
		if err := once(&d.seen, seenNacks, name); err != nil {
			return err
		}
		return d.list(name, func(i int) error {
			var n Nack
			if err := d.entryObject(&n, name, i, seenFrame|seenSource|seenKey|seenReason, d.nackField); err != nil {
				return err
			}
			a.Nacks = append(a.Nacks, n)
			return nil
		})
	}
	return nil
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

// entryObject decodes element i of the keys or nacks array into n with
// fn, and checks that the fields in need were all there.
func (d *ackDecoder) entryObject(n *Nack, list string, i int, need int, fn func(key []byte, plain bool) error) error {
	path := func() string { return fmt.Sprintf("%s[%d]", list, i) }
	if kind := d.dec.Peek(); kind != jsonscan.Object {
		return typeError(path(), "an object", kind)
	}
	d.entry, d.entrySeen = n, 0
	if err := d.dec.Object(fn); err != nil {
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

// keyField decodes the value of one member of a key ack.
func (d *ackDecoder) keyField(key []byte, plain bool) error {
	n := d.entry
	switch name := string(keyText(key, plain)); name {
	case "frame":
		if err := once(&d.entrySeen, seenFrame, name); err != nil {
			return err
		}
		return ackInt(&d.dec, &n.Frame, name, 1)
	case "source":
		if err := once(&d.entrySeen, seenSource, name); err != nil {
			return err
		}
		return d.source.decode(&d.dec, &n.Source, name, nullFails)
	case "key":
		if err := once(&d.entrySeen, seenKey, name); err != nil {
			return err
		}
		return decodeString(&d.dec, &n.Key, name, nullFails)
	}
	return nil
}

// nackField decodes the value of one member of a nack.
func (d *ackDecoder) nackField(key []byte, plain bool) error {
	n := d.entry
	switch name := string(keyText(key, plain)); name {
	case "reason":
		if err := once(&d.entrySeen, seenReason, name); err != nil {
			return err
		}
		if err := decodeString(&d.dec, &n.Reason, name, nullFails); err != nil {
			return err
		}
		n.Reason = truncateUTF8(n.Reason, MaxReasonBytes)
		return nil
	case "permanent":
		if err := once(&d.entrySeen, seenPermanent, name); err != nil {
			return err
		}
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
	return d.keyField(key, plain)
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
