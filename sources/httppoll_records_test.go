package sources

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

func TestHTTPPollFormats(t *testing.T) {
	tests := []struct {
		name        string
		spec        HTTPPollSpec
		body        string
		want        []string // record bytes
		wantReason  string   // malformed reason, when the body is bad
		wantMissing int
	}{
		{name: "records_path", spec: HTTPPollSpec{RecordsPath: "data.items"},
			body: `{"meta":{"items":"decoy"},"data":{"count":2, "items": [ {"id":1} ,{"id":"2","x":[1]}]},"data":{"items":[{"id":"dup"}]}}`,
			want: []string{`{"id":1}`, `{"id":"2","x":[1]}`}},
		{name: "records_path null", spec: HTTPPollSpec{RecordsPath: "data.items"}, body: `{"data":{"items":null}}`},
		{name: "records_path escaped key", spec: HTTPPollSpec{RecordsPath: "data"}, body: `{"d\u0061ta":[{"id":7}]}`, want: []string{`{"id":7}`}},
		{name: "records_path absent", spec: HTTPPollSpec{RecordsPath: "data.items"}, body: `{"data":{"other":[]}}`,
			wantReason: `records_path "data.items" not found`},
		{name: "records_path not an array", spec: HTTPPollSpec{RecordsPath: "data"}, body: `{"data":{"id":1}}`,
			wantReason: "records_path is not an array (found object)"},
		{name: "records_path body not an object", spec: HTTPPollSpec{RecordsPath: "data"}, body: `[{"id":1}]`,
			wantReason: "not a JSON object"},
		{name: "records_path invalid elsewhere", spec: HTTPPollSpec{RecordsPath: "data"}, body: `{"data":[{"id":1}],"x":tru}`,
			wantReason: "offset"},
		{name: "records_path trailing data", spec: HTTPPollSpec{RecordsPath: "data"}, body: `{"data":[]} []`,
			wantReason: "unexpected data after the value"},
		{name: "ndjson", spec: HTTPPollSpec{Format: "ndjson"}, body: "{\"id\":1}\r\n\n  {\"id\":2} \n\t\n\"three\"\n{\"no\":\"id\"}",
			want: []string{`{"id":1}`, `{"id":2}`, `"three"`, `{"no":"id"}`}, wantMissing: 2},
		{name: "ndjson empty", spec: HTTPPollSpec{Format: "ndjson"}, body: "\n \n"},
		{name: "ndjson bad line", spec: HTTPPollSpec{Format: "ndjson"}, body: "{\"id\":1}\n{\"id\":\n{\"id\":3}\n",
			wantReason: "line 2: unexpected end of input"},
		{name: "ndjson two values on a line", spec: HTTPPollSpec{Format: "ndjson"}, body: "{\"id\":1} {\"id\":2}\n",
			wantReason: "line 1: unexpected data after the value"},
		{name: "single", spec: HTTPPollSpec{Format: "single"}, body: "\n {\"id\":\"only\",\"items\":[1,2]}\n",
			want: []string{`{"id":"only","items":[1,2]}`}},
		{name: "single empty", spec: HTTPPollSpec{Format: "single"}, body: "  ", wantReason: "empty body"},
		{name: "single two values", spec: HTTPPollSpec{Format: "single"}, body: `{"id":1}{"id":2}`,
			wantReason: "unexpected data after the value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := pollServer(t, http.StatusOK, tt.body)
			spec := tt.spec
			spec.PollURL, spec.IDField = srv.URL, "id"
			src := openPoll(t, &spec)
			b, err := src.Fetch(t.Context(), "")
			parsed, perr := src.(Parser).Parse([]byte(tt.body), time.Unix(1, 0))
			if tt.wantReason != "" {
				m, ok := AsMalformed(err)
				pm, pok := AsMalformed(perr)
				if !ok || !pok || !strings.Contains(m.Reason, tt.wantReason) || pm.Reason != m.Reason {
					t.Fatalf("Fetch %v, Parse %v; want both malformed with %q", err, perr, tt.wantReason)
				}
				return
			}
			if err != nil || perr != nil {
				t.Fatalf("Fetch %v, Parse %v", err, perr)
			}
			var got []string
			for _, r := range b.Records {
				got = append(got, string(b.Body[r.Off:r.Off+r.Len]))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("records %q, want %q", got, tt.want)
			}
			if !slices.Equal(parsed.Records, b.Records) || !parsed.FetchedAt.Equal(time.Unix(1, 0)) || parsed.Cursor != "" || parsed.More {
				t.Errorf("Parse = %+v, want Fetch's records %+v", parsed, b.Records)
			}
			if n := src.(interface{ MissingIDs() int64 }).MissingIDs(); n != int64(tt.wantMissing) {
				t.Errorf("MissingIDs() = %d, want %d", n, tt.wantMissing)
			}
		})
	}
}

func TestHTTPPollMissingIDsAndNewestTime(t *testing.T) {
	srv, _ := pollServer(t, http.StatusOK, `[{"id":1,"ts":"2024-05-01T10:00:00Z"},{"x":2,"ts":"2024-05-01T12:00:00+01:00"},{"ts":"bad"}]`)
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, IDField: "id", TimeField: "ts"})
	type metrics interface {
		MissingIDs() int64
		NewestRecordTime() time.Time
	}
	m := src.(metrics)
	if !m.NewestRecordTime().IsZero() {
		t.Errorf("NewestRecordTime before any fetch = %v", m.NewestRecordTime())
	}
	for range 2 {
		if _, err := src.Fetch(t.Context(), ""); err != nil {
			t.Fatal(err)
		}
	}
	if m.MissingIDs() != 4 {
		t.Errorf("MissingIDs() = %d, want 2 per fetch", m.MissingIDs())
	}
	if want := time.Date(2024, 5, 1, 11, 0, 0, 0, time.UTC); !m.NewestRecordTime().Equal(want) {
		t.Errorf("NewestRecordTime() = %v, want %v", m.NewestRecordTime(), want)
	}
	// Without id_field, hashing is the rule, not a missing id.
	none := openPoll(t, &HTTPPollSpec{PollURL: srv.URL})
	if _, err := none.Fetch(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	if n := none.(metrics).MissingIDs(); n != 0 {
		t.Errorf("MissingIDs() without id_field = %d", n)
	}
}

// FuzzExtractRecords checks the record extractor over every format, with
// and without records_path: it never panics, every record lies inside the
// body and is one valid JSON value, a payload it accepts is valid, and the
// fields it finds in its single pass are those jsonscan.Field finds; and
// kept a slice at a time (a RecordReader reading the rest), the records
// are the same, as are the counts.
func FuzzExtractRecords(f *testing.F) {
	f.Add(uint8(0), "", []byte(`[{"id":1,"m":{"seq":2},"ts":"2024-05-01T10:00:00Z"}, "x", [], {"id":"a\"b"}]`))
	f.Add(uint8(0), "data.items", []byte(`{"data":{"items":[{"id":1},{"id":2,"id":3,"m":1,"m":{"seq":4}}]},"next":"/p?x=1"}`))
	f.Add(uint8(0), "data", []byte(`{"data":null}`))
	f.Add(uint8(1), "", []byte("{\"id\":1}\n\n {\"i\\u0064\":2}\r\n3\n"))
	f.Add(uint8(2), "", []byte(` {"id":"one","m":{"seq":1.5e3},"ts":"2024-05-01T10:00:00\u002B01:00"} `))
	f.Add(uint8(8), "", []byte(" [ {\"id\":1} ,\n{\"x\":2},\"s\" , 4,[5],{\"id\":\"\"},{\"m\":{\"seq\":7}} ] "))
	f.Add(uint8(16), "d", []byte(`{"d":[{"id":1},{"id":2},{"id":3},{"id":4},{"id":5}],"e":[1]}`))
	f.Add(uint8(9), "", []byte("{\"id\":1}\n\n{\"id\":2}\n  \n {\"id\":3} \r\n{\"id\":4}\n{\"id\":5}"))
	f.Fuzz(func(t *testing.T, format uint8, path string, body []byte) {
		r := recordRules{format: []string{"json", "ndjson", "single"}[format%3], idField: "id", cursorField: "m.seq", timeField: "ts"}
		if format&4 != 0 {
			r.idField, r.cursorField = "m", "m.seq" // one key both a field and on the way to another
		}
		if r.format == "json" && path != "" && !strings.HasPrefix(path, ".") && !strings.HasSuffix(path, ".") && !strings.Contains(path, "..") {
			r.recordsPath = path
		}
		ex, err := r.extract(body, 0, int(format>>5)%4) // a wrong guess of the count changes nothing
		if err != nil {
			return
		}
		checkSlices(t, &r, body, ex, 1+int(format>>3)%3)
		for i, rec := range ex.records {
			if rec.Off < 0 || rec.Len <= 0 || rec.Off+rec.Len > len(body) {
				t.Fatalf("record %d at %d+%d is outside the %d-byte body", i, rec.Off, rec.Len, len(body))
			}
			raw := body[rec.Off : rec.Off+rec.Len]
			if !json.Valid(raw) {
				t.Fatalf("record %d %q is not valid JSON", i, raw)
			}
			if i > 0 && rec.Off < ex.records[i-1].Off+ex.records[i-1].Len {
				t.Fatalf("record %d overlaps the one before", i)
			}
			key := scalarField(raw, r.idField)
			if key == "" {
				key = sha256Hex(raw)
			}
			val, kind, _ := jsonscan.Field(raw, r.timeField)
			if rec.Key != key || rec.Cursor != scalarField(raw, r.cursorField) || !rec.Time.Equal(jsonscan.Time(val, kind)) {
				t.Fatalf("record %d %q: key %q cursor %q time %v; Field says %q %q %v",
					i, raw, rec.Key, rec.Cursor, rec.Time, key, scalarField(raw, r.cursorField), jsonscan.Time(val, kind))
			}
		}
		if r.format != "ndjson" && !json.Valid(body) {
			t.Fatalf("accepted %q, which is not valid JSON", body)
		}
		if r.format == "single" && len(ex.records) != 1 {
			t.Fatalf("format single gave %d records", len(ex.records))
		}
	})
}

// checkSlices extracts body again keeping only keep records, reads the
// rest keep+1 at a time, and checks that this finds what the whole
// extraction ex found.
func checkSlices(t *testing.T, r *recordRules, body []byte, ex extracted, keep int) {
	t.Helper()
	sliced, err := r.extract(body, keep, 0)
	if err != nil {
		t.Fatalf("extract keeping %d: %v; whole, it was accepted", keep, err)
	}
	if len(sliced.records) != min(keep, len(ex.records)) || (sliced.rest == nil) != (len(ex.records) <= keep) {
		t.Fatalf("extract keeping %d of %d records kept %d, rest %v", keep, len(ex.records), len(sliced.records), sliced.rest)
	}
	got := sliced.records
	for sliced.rest != nil && sliced.rest.Left() > 0 {
		more, err := sliced.rest.Next(keep + 1)
		if err != nil {
			t.Fatalf("reading the rest: %v", err)
		}
		got = append(got, more...)
	}
	if !slices.Equal(got, ex.records) {
		t.Fatalf("records kept %d at a time:\n%+v\nwhole:\n%+v", keep, got, ex.records)
	}
	if sliced.total != len(ex.records) || sliced.missingIDs != ex.missingIDs || sliced.largest != ex.largest || !sliced.newest.Equal(ex.newest) {
		t.Fatalf("keeping %d: total %d, missing ids %d, largest %q, newest %v; whole: %d, %d, %q, %v", keep,
			sliced.total, sliced.missingIDs, sliced.largest, sliced.newest, len(ex.records), ex.missingIDs, ex.largest, ex.newest)
	}
}

// benchBody returns a JSON array of n records of about 1 KiB each, with
// id and seq at the start and the timestamp nested at the end.
func benchBody(n int) []byte {
	var b []byte
	b = append(b, '[')
	for i := range n {
		if i > 0 {
			b = append(b, ",\n"...)
		}
		b = fmt.Appendf(b, `{"id":"evt-%08d","seq":%d,"type":"order.updated",`, i, i)
		b = append(b, `"payload":{"customer":{"name":"Zo\u00eb \"Z\" O'Brien","tags":["vip","eu-west","]}"]},`...)
		b = append(b, `"lines":[`...)
		for j := range 6 {
			if j > 0 {
				b = append(b, ',')
			}
			b = fmt.Appendf(b, `{"sku":"SKU-%05d","qty":%d,"price":%d.99,"note":"handle with care, fragile item"}`, i*7+j, j+1, 10+j)
		}
		b = append(b, `],"comment":"`...)
		b = append(b, strings.Repeat("lorem ipsum dolor sit amet ", 11)...)
		b = fmt.Appendf(b, `"},"meta":{"source":"bench","updated_at":"2024-05-01T10:00:%02d.123456Z"}}`, i%60)
	}
	return append(b, ']')
}

// BenchmarkParse1KiB measures http_poll's Parse on 1 KiB JSON records with
// the id, sequence and time fields looked up.
func BenchmarkParse1KiB(b *testing.B) {
	const n = 1000
	body := benchBody(n)
	src, err := withDefaults(&HTTPPollSpec{PollURL: "http://bench.invalid/", IDField: "id", SequenceField: "seq",
		CursorParam: "since", TimeField: "meta.updated_at"}).Open(Env{Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	p := src.(Parser)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		batch, err := p.Parse(body, time.Time{})
		if err != nil || len(batch.Records) != n || batch.Records[n-1].Time.IsZero() || batch.Records[n-1].Cursor != "999" {
			b.Fatalf("Parse: %v", err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "records/s")
}

// TestHTTPPollPageOfManySlices fetches a page of more records than one
// slice: Records holds the first SliceRecords, Rest reads the others in
// order, and what the fetch reports of the page (the largest cursor, the
// newest time, records without an id, the next offset) covers every
// record, the ones after the first slice included.
func TestHTTPPollPageOfManySlices(t *testing.T) {
	total := 2*SliceRecords + 3
	var body strings.Builder
	body.WriteString("[")
	for n := 1; n <= total; n++ {
		if n > 1 {
			body.WriteString(",\n")
		}
		if n%1000 == 0 {
			fmt.Fprintf(&body, `{"seq":%d}`, n) // no id: keyed by its hash
			continue
		}
		fmt.Fprintf(&body, `{"id":"r%d","seq":%d,"ts":"%s"}`, n, n, time.Unix(int64(n), 0).UTC().Format(time.RFC3339))
	}
	body.WriteString("]")
	srv, _ := pollServer(t, http.StatusOK, body.String())
	src := openPoll(t, &HTTPPollSpec{PollURL: srv.URL, IDField: "id", CursorField: "seq", CursorParam: "since", TimeField: "ts",
		Pagination: "offset", OffsetParam: "offset"})
	b, err := src.Fetch(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Records) != SliceRecords || b.Rest == nil || b.RecordCount() != total {
		t.Fatalf("%d records kept, rest %v, %d in all; want %d kept of %d", len(b.Records), b.Rest, b.RecordCount(), SliceRecords, total)
	}
	c := decodeCursor(b.Cursor)
	if c.Next != strconv.Itoa(total) || c.Found != strconv.Itoa(total) || !b.More {
		t.Errorf("cursor %+v, more %v; want the next offset and the largest seq %d", c, b.More, total)
	}
	m := src.(interface {
		MissingIDs() int64
		NewestRecordTime() time.Time
	})
	if m.MissingIDs() != int64(total/1000) || !m.NewestRecordTime().Equal(time.Unix(int64(total), 0)) {
		t.Errorf("missing ids %d, newest %v; want %d and the last record's time", m.MissingIDs(), m.NewestRecordTime(), total/1000)
	}
	all := slices.Clone(b.Records)
	for b.Rest.Left() > 0 {
		more, err := b.Rest.Next(SliceRecords)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, more...)
	}
	if len(all) != total {
		t.Fatalf("%d records read in all, want %d", len(all), total)
	}
	for i, r := range all {
		n := i + 1
		want := `{"id":"r` + strconv.Itoa(n) + `",`
		if n%1000 == 0 {
			want = fmt.Sprintf(`{"seq":%d}`, n)
		}
		if raw := body.String()[r.Off : r.Off+r.Len]; !strings.HasPrefix(raw, want) || r.Cursor != strconv.Itoa(n) {
			t.Fatalf("record %d is %q with cursor %q", n, raw, r.Cursor)
		}
		if n%1000 != 0 && r.Key != "r"+strconv.Itoa(n) {
			t.Fatalf("record %d has key %q", n, r.Key)
		}
	}
}

// TestRecordsPathHint: a body that is an object where an array was
// expected names the first array in it as the records_path to set, at
// most three objects deep; an object without one gets no hint.
func TestRecordsPathHint(t *testing.T) {
	for _, tc := range []struct{ body, hint string }{
		{`{"data":{"items":[{"id":1}]}}`, `set records_path = "data.items"`},
		{`{"meta":{"n":1,"next":null},"results":[{"id":1}],"more":[2]}`, `set records_path = "results"`},
		{`{"count":0,"data":{"empty":{}},"rows":[]}`, `set records_path = "rows"`},
		{`{"a":1}`, ""},
		{`{"a":{"b":{"c":{"d":[1]}}}}`, ""},
	} {
		r := &recordRules{format: "json"}
		_, err := r.extract([]byte(tc.body), SliceRecords, 0)
		if err == nil || !strings.Contains(err.Error(), "not a JSON array (found an object)") {
			t.Errorf("%s: error %v, want it to say the body is not an array", tc.body, err)
			continue
		}
		if tc.hint == "" && strings.Contains(err.Error(), "records_path") || !strings.Contains(err.Error(), tc.hint) {
			t.Errorf("%s: error %q, want the hint %q", tc.body, err, tc.hint)
		}
	}
}
