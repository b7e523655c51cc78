package queue

import (
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// seqBatch is a batch of events of source, one per seq, keyed by device
// and seq, with findings collected.
func seqBatch(source, device, tag string, grace time.Duration, findings *[]SeqFinding, seqs ...int64) Batch {
	b := Batch{Source: source, FetchedAt: time.Now(), RawKey: fmt.Sprintf("%s/seq-%s%d", source, tag, seqs[0]), SeqGrace: grace, SeqFindings: findings}
	for i, s := range seqs {
		b.Events = append(b.Events, NewEvent{Key: fmt.Sprintf("%s-%s%d", device, tag, s), RawOff: i, RawLen: 1, Device: device, DevSeq: s})
	}
	return b
}

// TestDeviceSeqGapsAndResets appends the events of two devices with
// numbered events: a range missing longer than the grace is reported lost
// (once), a late event within it fills it, a seq that goes back is
// reported as a reset, duplicates count for nothing, and the state
// survives a reopen.
func TestDeviceSeqGapsAndResets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	q := openTest(t, path, 10)
	ctx := t.Context()
	var appendTagged func(q *Queue, device, tag string, grace time.Duration, seqs ...int64) []SeqFinding
	appendSeqs := func(q *Queue, device string, grace time.Duration, seqs ...int64) []SeqFinding {
		t.Helper()
		return appendTagged(q, device, "", grace, seqs...)
	}
	appendTagged = func(q *Queue, device, tag string, grace time.Duration, seqs ...int64) []SeqFinding {
		t.Helper()
		var got []SeqFinding
		if _, err := q.Append(ctx, seqBatch("devices", device, tag, grace, &got, seqs...)); err != nil {
			t.Fatal(err)
		}
		return got
	}
	expect := func(what string, got []SeqFinding, want ...SeqFinding) {
		t.Helper()
		if len(got) != len(want) || (len(want) > 0 && !reflect.DeepEqual(got, want)) {
			t.Errorf("%s: findings %+v, want %+v", what, got, want)
		}
	}
	const long = time.Hour
	expect("a first run in order", appendSeqs(q, "a", long, 3, 1, 2))
	expect("a skipped 4, within the grace", appendSeqs(q, "a", long, 5))
	expect("4 arrives late", appendSeqs(q, "a", long, 4))
	var missing string
	if err := q.rdb.QueryRow(`SELECT missing FROM device_seqs WHERE source = 'devices' AND device = 'a'`).Scan(&missing); err != nil || missing != "[]" {
		t.Errorf("device a after the late 4: missing %s (%v), want []", missing, err)
	}
	expect("6 missing, within the grace", appendSeqs(q, "a", long, 8, 7))
	expect("a duplicate of 3", appendSeqs(q, "a", long, 3))
	expect("the outbox was reset: its counter starts again", appendTagged(q, "a", "r", long, 1, 2), SeqFinding{Device: "a", Reset: true, From: 8, To: 1})

	expect("d is first seen at 5", appendSeqs(q, "d", long, 5))
	expect("d's 2, in flight before it, fills the numbers below", appendSeqs(q, "d", long, 2, 1))
	expect("d's 3 fills, 6 follows; 4 never came, and below the first seq it expires unreported", appendSeqs(q, "d", 0, 3, 6))
	expect("d goes on", appendSeqs(q, "d", 0, 7))

	expect("b's first event", appendSeqs(q, "b", 0, 1))
	expect("b skips 2-3, no grace", appendSeqs(q, "b", 0, 4), SeqFinding{Device: "b", From: 2, To: 3})
	expect("b skips 5-9", appendSeqs(q, "b", 0, 10), SeqFinding{Device: "b", From: 5, To: 9})
	expect("b's late 3: reported already, so a reset", appendSeqs(q, "b", 0, 3), SeqFinding{Device: "b", Reset: true, From: 10, To: 3})
	expect("a duplicate of 4 counts for nothing", appendSeqs(q, "b", 0, 4))

	var high, gaps, lost, resets int64
	if err := q.rdb.QueryRow(`SELECT high, missing, gaps, lost, resets FROM device_seqs WHERE source = 'devices' AND device = 'a'`).
		Scan(&high, &missing, &gaps, &lost, &resets); err != nil {
		t.Fatal(err)
	}
	if high != 2 || missing != "[]" || gaps != 0 || resets != 1 {
		t.Errorf("device a: high %d missing %s gaps %d resets %d, want 2 [] 0 1", high, missing, gaps, resets)
	}
	if err := q.rdb.QueryRow(`SELECT high, gaps, lost, resets FROM device_seqs WHERE source = 'devices' AND device = 'b'`).
		Scan(&high, &gaps, &lost, &resets); err != nil {
		t.Fatal(err)
	}
	if high != 3 || gaps != 2 || lost != 7 || resets != 1 {
		t.Errorf("device b: high %d gaps %d lost %d resets %d, want 3 2 7 1", high, gaps, lost, resets)
	}

	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q2, err := Open(Options{Path: path, EventsPerFrame: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := q2.Close(); err != nil {
			t.Error(err)
		}
	}()
	expect("after a reopen, b goes on from 3", appendTagged(q2, "b", "n", 0, 4, 6), SeqFinding{Device: "b", From: 5, To: 5})
}

// TestDeviceSeqMissingRangesAreBounded has a device skip every other
// number for longer than the grace allows ranges to be kept: beyond
// maxMissingRanges, the oldest are reported at once.
func TestDeviceSeqMissingRangesAreBounded(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 10)
	var got []SeqFinding
	seqs := []int64{1}
	for i := int64(1); i <= maxMissingRanges+3; i++ {
		seqs = append(seqs, 1+2*i)
	}
	if _, err := q.Append(t.Context(), seqBatch("devices", "c", "", time.Hour, &got, seqs...)); err != nil {
		t.Fatal(err)
	}
	want := []SeqFinding{{Device: "c", From: 2, To: 2}, {Device: "c", From: 4, To: 4}, {Device: "c", From: 6, To: 6}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("findings %+v, want the 3 oldest of %d ranges: %+v", got, maxMissingRanges+3, want)
	}
}

// TestDeviceSeqsSummary reads back what the tracking found: the sums over
// a source's devices, and the devices with a gap, a reset or a range still
// missing within the grace; a device whose only missing numbers lie below
// its first seq is not listed.
func TestDeviceSeqsSummary(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 10)
	add := func(device string, grace time.Duration, seqs ...int64) {
		t.Helper()
		var got []SeqFinding
		if _, err := q.Append(t.Context(), seqBatch("devices", device, "", grace, &got, seqs...)); err != nil {
			t.Fatal(err)
		}
	}
	add("quiet", time.Hour, 5, 6)      // 1-4 below its first seq
	add("gappy", 0, 1)                 //
	add("gappy", 0, 4)                 // 2-3 lost
	add("pending", time.Hour, 1, 2, 5) // 3-4 missing, within the grace
	add("in-order", 0, 1)              // nothing to say
	sum, err := q.DeviceSeqs(t.Context(), "devices", 10)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Devices != 4 || sum.Gaps != 1 || sum.Lost != 2 || sum.Resets != 0 {
		t.Errorf("summary %+v, want 4 devices, 1 gap of 2 seqs, no reset", sum)
	}
	got := map[string]DeviceSeq{}
	for _, d := range sum.Notable {
		got[d.Device] = d
	}
	if len(got) != 2 || got["gappy"].Gaps != 1 || got["gappy"].Lost != 2 || got["gappy"].LastSeq != 4 ||
		!reflect.DeepEqual(got["pending"].Missing, [][2]int64{{3, 4}}) || got["pending"].LastSeq != 5 {
		t.Errorf("notable devices %+v, want gappy (1 gap, 2 lost, last 4) and pending (missing 3-4, last 5)", sum.Notable)
	}
	if sum, err := q.DeviceSeqs(t.Context(), "devices", 1); err != nil || len(sum.Notable) != 1 {
		t.Errorf("limit 1: %d notable devices (%v), want 1", len(sum.Notable), err)
	}
	if sum, err := q.DeviceSeqs(t.Context(), "nothing", 10); err != nil || sum.Devices != 0 || sum.Notable != nil {
		t.Errorf("unknown source: %+v, %v", sum, err)
	}
}

// TestForgetDevicesKeepsTheLiveOnes: devices silent since the cutoff are
// forgotten (with the seqs they still missed counted, the quiet range
// below a first seq not), the others stay; a forgotten device that comes
// back starts again as a new one, with no gap or reset reported.
func TestForgetDevicesKeepsTheLiveOnes(t *testing.T) {
	q := openTest(t, filepath.Join(t.TempDir(), "q.db"), 10)
	ctx := t.Context()
	var findings []SeqFinding
	add := func(device, tag string, seqs ...int64) {
		t.Helper()
		if _, err := q.Append(ctx, seqBatch("devices", device, tag, time.Hour, &findings, seqs...)); err != nil {
			t.Fatal(err)
		}
	}
	add("gone", "", 3, 4, 7) // 1-2 quiet, 5-6 missing
	add("quiet", "", 1)
	cutoff := time.Now()
	add("live", "", 1, 2)
	devices, unreported, err := q.ForgetDevices(ctx, "devices", cutoff)
	if err != nil || devices != 2 || unreported != 2 {
		t.Fatalf("ForgetDevices = %d devices, %d unreported seqs, %v; want 2 (gone and quiet) and 2 (5-6)", devices, unreported, err)
	}
	s, err := q.DeviceSeqs(ctx, "devices", 10)
	if err != nil || s.Devices != 1 {
		t.Fatalf("devices tracked after forgetting = %+v, %v; want live only", s, err)
	}
	findings = nil
	add("gone", "back", 9)
	if len(findings) != 0 {
		t.Errorf("a forgotten device coming back reported %+v, want nothing", findings)
	}
	if devices, _, err := q.ForgetDevices(ctx, "devices", cutoff); err != nil || devices != 0 {
		t.Errorf("forgetting again with the same cutoff: %d, %v; want none", devices, err)
	}
}
