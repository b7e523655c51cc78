package sources

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// recordRules say where the records are in a payload and which fields of
// a record matter. They never decode a whole payload: one validating byte
// scan (jsonscan.Decoder) finds the records and, on the way, the raw bytes
// of the few fields wanted; every byte is scanned once.
type recordRules struct {
	// format is "json", "ndjson" or "single".
	format string
	// recordsPath is the dotted path of the records array for "json"; ""
	// means the body is the array.
	recordsPath string
	// idField, cursorField and timeField are dotted paths in a record; ""
	// means none.
	idField, cursorField, timeField string
}

// The fields a record walk looks for, as bits of a mask.
const (
	fieldID = iota
	fieldCursor
	fieldTime
	numFields
)

// recordScan is the state of one extraction.
type recordScan struct {
	d    jsonscan.Decoder
	body []byte
	// base is the offset in body of the decoder's input: a line of ndjson.
	base  int
	paths [numFields][]string // split dotted paths; nil when unset
	want  uint8               // the bits of the paths that are set
	idSet bool
	// vals and kinds hold the fields found in the current record.
	vals  [numFields][]byte
	kinds [numFields]jsonscan.Kind
	// keep is the most records kept in ex.records (0: all); the records
	// after them are validated and counted, and RecordReader finds them
	// again.
	keep int
	ex   extracted
}

// extracted is what extract found in a payload.
type extracted struct {
	records []Record
	// missingIDs counts records without the id field (when one is set),
	// whose key is the SHA-256 of their bytes instead.
	missingIDs int
	// largest is the largest record cursor, by CompareCursor; "" if none.
	largest string
	// newest is the newest record time; zero if none.
	newest time.Time
	// total counts the records, kept or not.
	total int
	// rest reads the records after those kept; nil when all are kept.
	rest *RecordReader
	// restOff is the offset of the first record not kept, restLine its
	// line for ndjson.
	restOff, restLine int
}

// newScan returns the state of an extraction from body by r.
func (r *recordRules) newScan(body []byte) *recordScan {
	sc := &recordScan{body: body, idSet: r.idField != ""}
	for i, p := range [numFields]string{r.idField, r.cursorField, r.timeField} {
		if p != "" {
			sc.paths[i] = strings.Split(p, ".")
			sc.want |= 1 << i
		}
	}
	return sc
}

// extract finds the records in body, validating it whole, and keeps the
// first keep of them (0: all); when there are more, the result's rest
// reads them afterwards, keep at a time if the caller likes, so that a
// page of a million tiny records never has a Record for each at once. A
// payload that does not have the configured shape yields an error whose
// text says why; the caller turns it into a *MalformedError. expect is
// how many records body likely holds (0: no idea), the capacity the
// records start with: a slice grown by doubling allocates twice what it
// ends up holding.
func (r *recordRules) extract(body []byte, keep, expect int) (extracted, error) {
	sc := r.newScan(body)
	sc.keep = keep
	if keep > 0 {
		expect = min(expect, keep)
	}
	if expect > 0 {
		sc.ex.records = make([]Record, 0, expect)
	}
	ex, err := sc.extract(r)
	if err != nil || ex.total == len(ex.records) {
		return ex, err
	}
	ex.rest = &RecordReader{sc: r.newScan(body), ndjson: r.format == "ndjson", off: ex.restOff, line: ex.restLine,
		left: ex.total - len(ex.records)}
	return ex, nil
}

// extract runs the extraction sc was made for by r.
func (sc *recordScan) extract(r *recordRules) (extracted, error) {
	body := sc.body
	var err error
	switch {
	case r.format == "ndjson":
		err = sc.ndjson()
	case len(bytes.TrimSpace(body)) == 0:
		what := "array"
		if r.format == "single" {
			what = "value"
		} else if r.recordsPath != "" {
			what = "object"
		}
		return extracted{}, errors.New("empty body, expected a JSON " + what)
	case r.format == "single":
		sc.d.Reset(body)
		if err = sc.record(); err == nil {
			err = sc.d.End()
		}
	case r.recordsPath == "":
		sc.d.Reset(body)
		if kind := sc.d.Peek(); kind != jsonscan.Array {
			_, err = jsonscan.SplitArray(body) // its message names what was found
			if path := arrayPath(body); kind == jsonscan.Object && path != "" {
				err = fmt.Errorf("%w; the records may be the array at %q: set records_path = %q", err, path, path)
			}
			break
		}
		if err = sc.d.Array(sc.record); err == nil {
			err = sc.d.End()
		}
		if err != nil {
			// SplitArray accepts exactly what the Decoder accepts, and
			// words its errors for an array.
			if _, serr := jsonscan.SplitArray(body); serr != nil {
				err = serr
			}
		}
	default:
		sc.d.Reset(body)
		err = sc.at(r.recordsPath)
	}
	if err != nil {
		return extracted{}, err
	}
	return sc.ex, nil
}

// record reads the record at the decoder's position, validating it, and
// adds it with its key, cursor and time.
func (sc *recordScan) record() error {
	sc.d.Peek() // skips whitespace, so that Offset is the record's first byte
	off := sc.d.Offset()
	sc.vals, sc.kinds = [numFields][]byte{}, [numFields]jsonscan.Kind{}
	var err error
	if sc.want != 0 && sc.d.Peek() == jsonscan.Object {
		err = sc.walk(0, sc.want)
	} else {
		_, _, err = sc.d.Value()
	}
	if err != nil {
		return err
	}
	sc.ex.total++
	r := Record{Off: sc.base + off, Len: sc.d.Offset() - off}
	if r.Cursor = jsonscan.ScalarText(sc.vals[fieldCursor], sc.kinds[fieldCursor]); r.Cursor != "" {
		if sc.ex.largest == "" || CompareCursor(r.Cursor, sc.ex.largest) > 0 {
			sc.ex.largest = r.Cursor
		}
	}
	if r.Time = jsonscan.Time(sc.vals[fieldTime], sc.kinds[fieldTime]); r.Time.After(sc.ex.newest) {
		sc.ex.newest = r.Time
	}
	if sc.keep > 0 && len(sc.ex.records) == sc.keep {
		// Counted, not kept: RecordReader reads it again.
		if sc.ex.total == sc.keep+1 {
			sc.ex.restOff = r.Off
		}
		if sc.idSet && !hasText(sc.kinds[fieldID], sc.vals[fieldID]) {
			sc.ex.missingIDs++
		}
		return nil
	}
	if r.Key = jsonscan.ScalarText(sc.vals[fieldID], sc.kinds[fieldID]); r.Key == "" {
		sum := sha256.Sum256(sc.body[r.Off : r.Off+r.Len])
		r.Key = hex.EncodeToString(sum[:])
		if sc.idSet {
			sc.ex.missingIDs++
		}
	}
	sc.ex.records = append(sc.ex.records, r)
	return nil
}

// hasText reports whether jsonscan.ScalarText of a value the decoder
// validated is not empty, without making the string.
func hasText(kind jsonscan.Kind, val []byte) bool {
	return kind == jsonscan.Number || (kind == jsonscan.String && len(val) > 0)
}

// walk reads the object at the decoder's position, depth keys deep in a
// record, and keeps the values of the wanted paths (a mask) that it holds.
// As with jsonscan.Field, the first of duplicated keys wins, and a path
// through a value that is not an object is absent.
func (sc *recordScan) walk(depth int, want uint8) error {
	var seen uint8
	return sc.d.Object(func(key []byte, plain bool) error {
		var leaf, inner uint8
		for i := range numFields {
			bit := uint8(1) << i
			if want&bit == 0 || seen&bit != 0 || !keyIs(key, plain, sc.paths[i][depth]) {
				continue
			}
			seen |= bit
			if len(sc.paths[i]) == depth+1 {
				leaf |= bit
			} else {
				inner |= bit
			}
		}
		switch {
		case leaf == 0 && inner == 0:
			return nil // skipped, and validated, by Object
		case leaf == 0:
			if sc.d.Peek() != jsonscan.Object {
				return nil
			}
			return sc.walk(depth+1, inner)
		}
		val, kind, err := sc.d.Value()
		if err != nil {
			return err
		}
		for i := range numFields {
			switch bit := uint8(1) << i; {
			case leaf&bit != 0:
				sc.vals[i], sc.kinds[i] = val, kind
			case inner&bit != 0 && kind == jsonscan.Object:
				// One key is both a wanted field and on the way to
				// another: rare, so look the deeper one up again.
				if v, k, ok := jsonscan.Field(val, strings.Join(sc.paths[i][depth+1:], ".")); ok {
					sc.vals[i], sc.kinds[i] = v, k
				}
			}
		}
		return nil
	})
}

// at reads the object body, in which the records are the array at path. A
// null there means no records; an absent path or another kind of value is
// an error.
func (sc *recordScan) at(path string) error {
	found := false
	var descend func(path string) error
	descend = func(path string) error {
		key, rest, more := strings.Cut(path, ".")
		seen := false
		return sc.d.Object(func(k []byte, plain bool) error {
			if seen || !keyIs(k, plain, key) {
				return nil // skipped, and validated, by Object
			}
			seen = true
			if more {
				if sc.d.Peek() != jsonscan.Object {
					return nil
				}
				return descend(rest)
			}
			found = true
			switch kind := sc.d.Peek(); kind {
			case jsonscan.Null:
				return nil
			case jsonscan.Array:
				return sc.d.Array(sc.record)
			default:
				return fmt.Errorf("records_path is not an array (found %s)", kind)
			}
		})
	}
	err := descend(path)
	if err == nil {
		err = sc.d.End()
	}
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("records_path %q not found", path)
	}
	return nil
}

// keyIs reports whether the raw object key k is name.
func keyIs(k []byte, plain bool, name string) bool {
	if plain {
		return string(k) == name
	}
	s, err := jsonscan.Unquote(k)
	return err == nil && s == name
}

// ndjson reads newline-delimited JSON: one JSON value per line, blank
// lines skipped. One bad line makes the whole payload bad.
func (sc *recordScan) ndjson() error {
	_, _, err := sc.lines(0, 1, -1)
	return err
}

// lines reads the lines of ndjson from offset off, line number line, until
// it has read max records (max < 0: to the end), and returns the offset
// and number of the line after the last one read.
func (sc *recordScan) lines(off, line, max int) (int, int, error) {
	body := sc.body
	for ; off < len(body) && max != 0; line++ {
		end := bytes.IndexByte(body[off:], '\n')
		if end < 0 {
			end = len(body)
		} else {
			end += off
		}
		start, stop := off, end
		for start < stop && isJSONSpace(body[start]) {
			start++
		}
		for stop > start && isJSONSpace(body[stop-1]) {
			stop--
		}
		off = end + 1
		if start == stop {
			continue
		}
		sc.d.Reset(body[start:stop])
		sc.base = start
		err := sc.record()
		if err == nil {
			err = sc.d.End()
		}
		if err != nil {
			return off, line, fmt.Errorf("line %d: %w", line, err)
		}
		if sc.keep > 0 && sc.ex.total == sc.keep+1 {
			sc.ex.restLine = line
		}
		max--
	}
	return off, line, nil
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// RecordReader reads the records of a page that follow the first slice,
// which Batch.Records holds, a slice at a time (Batch.Rest). It reads the
// page again from where the last slice ended, so that a page of a million
// tiny records never has a million Records at once; the fetch validated
// the whole page first, so the records it finds are the ones the fetch
// counted, in the same order, with the same keys. It is not safe for
// concurrent use.
type RecordReader struct {
	sc     *recordScan
	ndjson bool
	off    int // the offset of the next record's first byte
	line   int // its line, for ndjson
	left   int // records not read yet
}

// Left returns how many records are still to be read.
func (r *RecordReader) Left() int { return r.left }

// Next returns the next records, at most n, in page order, and none once
// Left is 0. An error means the page is not what the fetch validated (a
// bug); the reader then has nothing left.
func (r *RecordReader) Next(n int) ([]Record, error) {
	want := max(min(n, r.left), 0)
	sc := r.sc
	sc.ex = extracted{records: make([]Record, 0, want)}
	var err error
	if r.ndjson {
		r.off, r.line, err = sc.lines(r.off, r.line, want)
	} else {
		for len(sc.ex.records) < want && err == nil {
			err = r.element()
		}
	}
	if err == nil && len(sc.ex.records) != want {
		err = fmt.Errorf("%d records found, %d expected", len(sc.ex.records), want)
	}
	if err != nil {
		r.left = 0
		return nil, fmt.Errorf("read the records of a page again: %w", err)
	}
	r.left -= want
	return sc.ex.records, nil
}

// element reads the array element at r.off and moves r.off past the comma
// after it.
func (r *RecordReader) element() error {
	sc := r.sc
	sc.d.Reset(sc.body[r.off:])
	sc.base = r.off
	if err := sc.record(); err != nil {
		return err
	}
	i := r.off + sc.d.Offset()
	for i < len(sc.body) && isJSONSpace(sc.body[i]) {
		i++
	}
	if i < len(sc.body) && sc.body[i] == ',' {
		r.off = i + 1
		return nil
	}
	r.off = len(sc.body) // the array ends: no record follows
	return nil
}

// Parse implements Parser: it extracts the records of body with the same
// rules as Fetch. Records without the id field are not counted here.
func (p *httpPoll) Parse(body []byte, fetchedAt time.Time) (*Batch, error) {
	ex, err := p.rules.extract(body, 0, 0)
	if err != nil {
		return nil, &MalformedError{Body: body, FetchedAt: fetchedAt, Reason: err.Error()}
	}
	return &Batch{Body: body, FetchedAt: fetchedAt, Records: ex.records}, nil
}

// arrayPath returns the dotted path of the first array in body, a JSON
// object, found at most three objects deep (the records of an API that
// wraps them, such as {"data":{"items":[...]}}), or "" when there is
// none: records_path's hint for a body that is not an array. It reads
// tokens only until it finds one, and at most a few thousand.
func arrayPath(body []byte) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	type object struct {
		key     string
		wantKey bool
	}
	var stack []object // the objects around the next token
	for range 5000 {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		top := len(stack) - 1
		if top >= 0 && stack[top].wantKey {
			if tok == json.Delim('}') {
				stack = stack[:top]
				if top > 0 {
					stack[top-1].wantKey = true
				}
				continue
			}
			key, _ := tok.(string)
			stack[top].key, stack[top].wantKey = key, false
			continue
		}
		switch tok {
		case json.Delim('{'):
			if len(stack) == 3 {
				return ""
			}
			stack = append(stack, object{wantKey: true})
			continue
		case json.Delim('['):
			if top < 0 {
				return ""
			}
			keys := make([]string, len(stack))
			for i, o := range stack {
				keys[i] = o.key
			}
			return strings.Join(keys, ".")
		}
		if top >= 0 {
			stack[top].wantKey = true // a scalar value: a key comes next
		}
	}
	return ""
}
