package edge

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/devicewire"
	"github.com/ingestorhq/ingestor/internal/edge/edgeconfig"
)

// testEncoder makes the envelopes of the outbox tests.
func testEncoder() *devicewire.Encoder {
	return &devicewire.Encoder{DeviceID: "dev-1", SessionID: "s1", MaxBytes: edgeconfig.DefaultMaxEnvelopeBytes, Now: time.Now}
}

func openTestOutbox(t *testing.T, path string, maxBytes int64) *outbox {
	t.Helper()
	ob, err := openOutbox(t.Context(), path, maxBytes, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return ob
}

// envelopes parses items, failing the test on a bad one.
func envelopes(t *testing.T, items ...string) []*envelope {
	t.Helper()
	enc := testEncoder()
	var out []*envelope
	for _, it := range items {
		e, err := parse(enc, []byte(it), "", "")
		if err != nil {
			t.Fatalf("parse %s: %v", it, err)
		}
		out = append(out, e)
	}
	return out
}

// TestOutboxCommitSurvivesReopen stores events, closes and reopens the
// outbox, and finds the same rows, bytes and seq counter.
func TestOutboxCommitSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "outbox.db")
	ob := openTestOutbox(t, path, 1<<20)
	envs := envelopes(t, `{"type":"a","payload":1}`, `{"type":"b","payload":2}`)
	if err := ob.add(t.Context(), envs); err != nil {
		t.Fatal(err)
	}
	if err := ob.close(); err != nil {
		t.Fatal(err)
	}
	ob = openTestOutbox(t, path, 1<<20)
	defer func() {
		if err := ob.close(); err != nil {
			t.Error(err)
		}
	}()
	if n, b := ob.backlog(); n != 2 || b != int64(len(envs[0].raw)+len(envs[1].raw)) {
		t.Errorf("backlog after reopen = %d events, %d bytes", n, b)
	}
	rows, err := ob.pending(t.Context(), 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || !bytes.Equal(rows[0].env, envs[0].raw) || !bytes.Equal(rows[1].env, envs[1].raw) ||
		rows[0].eventID != envs[0].EventID {
		t.Fatalf("rows = %+v", rows)
	}
	if !bytes.HasPrefix(rows[0].env, []byte(`{"seq":1,`)) || !bytes.HasPrefix(rows[1].env, []byte(`{"seq":2,`)) {
		t.Errorf("seq not assigned in order: %s %s", rows[0].env, rows[1].env)
	}
	more := envelopes(t, `{"type":"c","payload":3}`)
	if err := ob.add(t.Context(), more); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(more[0].raw, []byte(`{"seq":3,`)) {
		t.Errorf("seq after reopen: %s", more[0].raw)
	}
}

// TestOutboxLockedAgainstASecondForwarder opens one outbox twice.
func TestOutboxLockedAgainstASecondForwarder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	ob := openTestOutbox(t, path, 1<<20)
	defer func() {
		if err := ob.close(); err != nil {
			t.Error(err)
		}
	}()
	if _, err := openOutbox(t.Context(), path, 1<<20, slog.Default()); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second open: %v, want in use", err)
	}
}

// TestOutboxFullRefusesAndStoresNothing fills the outbox to its byte
// limit: the batch that does not fit is refused whole, and a stored ACK
// makes room again.
func TestOutboxFullRefusesAndStoresNothing(t *testing.T) {
	ob := openTestOutbox(t, filepath.Join(t.TempDir(), "outbox.db"), 600)
	defer func() {
		if err := ob.close(); err != nil {
			t.Error(err)
		}
	}()
	first := envelopes(t, `{"type":"a","payload":"`+strings.Repeat("x", 100)+`"}`)
	if err := ob.add(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	evN, byN := ob.backlog()
	batch := envelopes(t, `{"type":"b","payload":"`+strings.Repeat("y", 100)+`"}`, `{"type":"c","payload":"`+strings.Repeat("z", 100)+`"}`)
	err := ob.add(t.Context(), batch)
	if !errors.Is(err, ErrOutboxFull) || !strings.Contains(err.Error(), "max_outbox_bytes 600") {
		t.Fatalf("add over the limit: %v, want ErrOutboxFull naming the limit", err)
	}
	if n, b := ob.backlog(); n != evN || b != byN {
		t.Fatalf("refused batch changed the backlog: %d, %d", n, b)
	}
	if s := ob.stats(); s.Events != 1 {
		t.Fatalf("refused batch stored rows: %+v", s)
	}
	rows, err := ob.pending(t.Context(), 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.settle(t.Context(), nil, []outcome{{id: rows[0].id, status: devicewire.StatusStored}}); err != nil {
		t.Fatal(err)
	}
	if err := ob.add(t.Context(), batch); err != nil {
		t.Fatalf("add once the ACK made room: %v", err)
	}
	if !bytes.HasPrefix(batch[0].raw, []byte(`{"seq":2,`)) {
		t.Errorf("the refused batch used up a seq: %s", batch[0].raw)
	}
}

// TestOutboxSettle applies one answer of each kind.
func TestOutboxSettle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	ob := openTestOutbox(t, path, 1<<20)
	envs := envelopes(t, `{"type":"a","payload":1}`, `{"type":"b","payload":2}`, `{"type":"c","payload":3}`)
	if err := ob.add(t.Context(), envs); err != nil {
		t.Fatal(err)
	}
	rows, err := ob.pending(t.Context(), 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.sent(t.Context(), []int64{rows[2].id}); err != nil {
		t.Fatal(err)
	}
	retryAt := time.Now().Add(time.Hour)
	if _, err := ob.settle(t.Context(), []int64{rows[1].id, rows[2].id}, []outcome{
		{id: rows[0].id, status: devicewire.StatusStored},
		{id: rows[1].id, status: devicewire.StatusRejected, reason: "bad type"},
		{id: rows[2].id, status: devicewire.StatusRetry, reason: "busy", retryAt: retryAt},
	}); err != nil {
		t.Fatal(err)
	}
	s := ob.stats()
	if s.Events != 1 || s.Retried != 1 || s.DeadLetters != 1 || s.LastDeadLetter != "bad type" || s.Bytes != int64(len(envs[2].raw)) {
		t.Fatalf("stats = %+v", s)
	}
	if n, b := ob.backlog(); n != 1 || b != int64(len(envs[2].raw)) {
		t.Errorf("backlog = %d, %d", n, b)
	}
	due, ok, err := ob.nextDue(t.Context())
	if err != nil || !ok || due.UnixMilli() != retryAt.UnixMilli() {
		t.Errorf("nextDue = %v %v %v, want %v", due, ok, err, retryAt)
	}
	if rows, err := ob.pending(t.Context(), 10, nil); err != nil || len(rows) != 0 {
		t.Errorf("pending during the retry wait = %v %v, want none", rows, err)
	}
	var attempts int
	var lastErr string
	if err := ob.db.QueryRow(`SELECT attempts, last_error FROM outbox`).Scan(&attempts, &lastErr); err != nil || attempts != 2 || lastErr != "busy" {
		t.Errorf("attempts, last_error = %d, %q (%v)", attempts, lastErr, err)
	}
	var env []byte
	var dlAttempts int
	if err := ob.db.QueryRow(`SELECT envelope, attempts FROM dead_letters`).Scan(&env, &dlAttempts); err != nil ||
		!bytes.Equal(env, envs[1].raw) || dlAttempts != 1 {
		t.Errorf("dead letter = %s after %d attempts (%v), want %s after 1", env, dlAttempts, err, envs[1].raw)
	}
	if err := ob.close(); err != nil {
		t.Fatal(err)
	}
	ob = openTestOutbox(t, path, 1<<20)
	defer func() {
		if err := ob.close(); err != nil {
			t.Error(err)
		}
	}()
	if rows, err := ob.pending(t.Context(), 10, nil); err != nil || len(rows) != 1 {
		t.Errorf("pending after a restart = %v %v, want the retried row at once", rows, err)
	}
}

// TestReadStatus reads the backlog of an outbox a forwarder holds, and
// refuses a missing file without creating it.
func TestReadStatus(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	ob := openTestOutbox(t, path, 1<<20)
	defer func() {
		if err := ob.close(); err != nil {
			t.Error(err)
		}
	}()
	if err := ob.add(t.Context(), envelopes(t, `{"type":"a","payload":1}`)); err != nil {
		t.Fatal(err)
	}
	s, err := ReadStatus(context.Background(), path)
	if err != nil || s.Events != 1 || s.Oldest.IsZero() {
		t.Fatalf("ReadStatus = %+v, %v", s, err)
	}
	var out strings.Builder
	if err := s.Print(&out, path, s.Oldest.Add(90*time.Second)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "pending:       1 events") || !strings.Contains(out.String(), "oldest:        1m30s") {
		t.Errorf("status:\n%s", out.String())
	}
	missing := filepath.Join(t.TempDir(), "none.db")
	if _, err := ReadStatus(context.Background(), missing); err == nil || fileExists(missing) {
		t.Errorf("ReadStatus of a missing file: %v (created: %v)", err, fileExists(missing))
	}
}

// TestOutboxGroupCommit adds from many goroutines at once into an outbox
// with room for about half: each request is stored whole or refused
// whole, the byte count matches the rows, and the seq values stored are
// 1..n without the gaps a refused request would leave.
func TestOutboxGroupCommit(t *testing.T) {
	ob := openTestOutbox(t, filepath.Join(t.TempDir(), "outbox.db"), 20_000)
	defer func() {
		if err := ob.close(); err != nil {
			t.Error(err)
		}
	}()
	const workers = 64
	results := make(chan error, workers)
	for range workers {
		envs := envelopes(t, `{"type":"a","payload":"`+strings.Repeat("x", 200)+`"}`, `{"type":"b","payload":2}`)
		go func() { results <- ob.add(t.Context(), envs) }()
	}
	stored := 0
	for range workers {
		switch err := <-results; {
		case err == nil:
			stored++
		case !errors.Is(err, ErrOutboxFull):
			t.Fatal(err)
		}
	}
	if stored == 0 || stored == workers {
		t.Fatalf("%d of %d requests stored, want some refused by a 20000-byte limit", stored, workers)
	}
	var rows, sum, maxSeq int64
	if err := ob.db.QueryRow(`SELECT COUNT(*), COALESCE(SUM(size), 0) FROM outbox`).Scan(&rows, &sum); err != nil {
		t.Fatal(err)
	}
	if err := ob.db.QueryRow(`SELECT last FROM seq WHERE device_id = 'dev-1'`).Scan(&maxSeq); err != nil {
		t.Fatal(err)
	}
	events, size := ob.backlog()
	if rows != int64(2*stored) || events != rows || size != sum || maxSeq != rows {
		t.Errorf("%d requests stored: %d rows of %d bytes, backlog %d events of %d bytes, last seq %d",
			stored, rows, sum, events, size, maxSeq)
	}
}
