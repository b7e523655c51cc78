package queue

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestQuarantineKeepsNewest stores more deliveries than a source keeps, in
// several requests: each source keeps its newest Keep, oldest dropped; a
// body that is not UTF-8 goes through JSON as base64; clearing one source
// leaves the other.
func TestQuarantineKeepsNewest(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 10)
	ctx := t.Context()
	for i := range 12 {
		rs := []Rejected{{Source: "a", At: time.Now(), Reason: "bad_signature", Code: 401, RequestID: "a" + strconv.Itoa(i),
			Headers: map[string][]string{"X-N": {strconv.Itoa(i)}}, Body: []byte{0xff, byte(i)}, Keep: 5}}
		if i%4 == 0 {
			rs = append(rs, Rejected{Source: "b", At: time.Now(), Reason: "too_large", Code: 413, RequestID: "b" + strconv.Itoa(i), Keep: 2})
		}
		if err := q.Quarantine(ctx, rs); err != nil {
			t.Fatal(err)
		}
	}
	list, err := q.QuarantineList(ctx, "a", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 5 || list[0].RequestID != "a11" || list[4].RequestID != "a7" || list[0].Body != nil {
		t.Fatalf("source a keeps %+v, want a11 down to a7 without bodies", list)
	}
	if all, err := q.QuarantineList(ctx, "", 100); err != nil || len(all) != 7 {
		t.Fatalf("whole quarantine = %d entries (err %v), want 5 + 2", len(all), err)
	}
	e, err := q.Quarantined(ctx, list[0].ID)
	if err != nil || string(e.Body) != string([]byte{0xff, 11}) || e.Headers["X-N"][0] != "11" || e.Code != 401 {
		t.Fatalf("Quarantined(%d) = %+v, %v", list[0].ID, e, err)
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	var back Rejected
	if err := json.Unmarshal(b, &back); err != nil || string(back.Body) != string(e.Body) {
		t.Fatalf("JSON %s read back as %+v (err %v)", b, back, err)
	}
	if _, err := q.Quarantined(ctx, 999); !errors.Is(err, ErrNoQuarantined) {
		t.Fatalf("Quarantined(999) err = %v, want ErrNoQuarantined", err)
	}
	if n, err := q.ClearQuarantine(ctx, "a"); err != nil || n != 5 {
		t.Fatalf("ClearQuarantine(a) = %d, %v; want 5", n, err)
	}
	if all, err := q.QuarantineList(ctx, "", 100); err != nil || len(all) != 2 || all[0].Source != "b" {
		t.Fatalf("after clearing a: %+v (err %v), want b's 2", all, err)
	}
}
