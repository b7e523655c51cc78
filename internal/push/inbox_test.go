package push

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ingestorhq/ingestor/internal/ingest"
	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
)

// frameLog is the Sender of these tests: it keeps the frames the inbox
// hands over, as the ZeroMQ sender would take them.
type frameLog struct {
	mu     sync.Mutex
	frames []queue.Frame
}

func (l *frameLog) Submit(frames []queue.Frame) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.frames = append(l.frames, frames...)
}

func (l *frameLog) events() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, f := range l.frames {
		n += len(f.Events)
	}
	return n
}

// openInbox opens an inbox on a real queue and a real file raw store in a
// temporary directory.
func openInbox(t *testing.T, maxPending int64) (*Inbox, *queue.Queue, rawstore.Store, *frameLog) {
	t.Helper()
	return openInboxIn(t, t.TempDir(), maxPending)
}

// openInboxIn is openInbox in dir: the queue is dir/queue.db, the raw
// store dir/raw.
func openInboxIn(t *testing.T, dir string, maxPending int64, tune ...func(*InboxOptions)) (*Inbox, *queue.Queue, rawstore.Store, *frameLog) {
	t.Helper()
	q, err := queue.Open(queue.Options{Path: filepath.Join(dir, "queue.db")})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := rawstore.Open(context.Background(), rawstore.Options{URL: "file://" + filepath.Join(dir, "raw")})
	if err != nil {
		t.Fatal(err)
	}
	log := &frameLog{}
	o := InboxOptions{Queue: q, Ingest: ingest.New(ingest.Options{Queue: q, Raw: raw, Sender: log}), MaxPendingEvents: maxPending}
	for _, f := range tune {
		f(&o)
	}
	in := NewInbox(o)
	t.Cleanup(func() {
		in.Close()
		if err := q.Close(); err != nil {
			t.Error(err)
		}
	})
	return in, q, raw, log
}

// TestInboxConcurrentSameKeys has 20 senders commit the same 50 keys at
// once: the ledger keeps one row per key, exactly one commit of each key
// is answered New, every other one is a duplicate with the stored status,
// and each new event's bytes are in its raw object where the frame says.
func TestInboxConcurrentSameKeys(t *testing.T) {
	in, q, raw, log := openInbox(t, 1_000_000)
	const senders, keys = 20, 50
	var mu sync.Mutex
	news := map[string]int{}
	seqs := map[string]int64{}
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for k := range keys {
				body := fmt.Appendf(nil, `{"id":"k%d","from":%d}`, k, s)
				outs, err := in.Commit(context.Background(), "hooks", body, []Event{{Key: fmt.Sprintf("k%d", k), Len: len(body)}})
				if err != nil {
					t.Errorf("commit k%d from %d: %v", k, s, err)
					return
				}
				o := outs[0]
				mu.Lock()
				if o.New {
					news[o.Key]++
				}
				if prev, ok := seqs[o.Key]; ok && prev != o.Seq {
					t.Errorf("key %s answered seq %d and %d", o.Key, prev, o.Seq)
				}
				seqs[o.Key] = o.Seq
				mu.Unlock()
				if o.Status != queue.StatusQueued && o.Status != queue.StatusDelivered {
					t.Errorf("key %s status %q, want queued", o.Key, o.Status)
				}
			}
		})
	}
	wg.Wait()
	if len(news) != keys {
		t.Fatalf("%d keys answered New, want %d", len(news), keys)
	}
	for k, n := range news {
		if n != 1 {
			t.Errorf("key %s answered New %d times, want once", k, n)
		}
	}
	if got := q.PendingEvents(); got != keys {
		t.Errorf("queue holds %d events, want %d", got, keys)
	}
	if got := log.events(); got != keys {
		t.Errorf("sender got %d events, want %d", got, keys)
	}
	for _, f := range log.frames {
		for _, e := range f.Events {
			obj, err := raw.Get(context.Background(), e.RawKey)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(obj[e.RawOff : e.RawOff+e.RawLen]); got != string(e.Payload) {
				t.Errorf("raw bytes of %s = %q, frame payload %q", e.Key, got, e.Payload)
			}
		}
	}
	st, ok, err := in.EventByKey(context.Background(), "hooks", "k7")
	if err != nil || !ok {
		t.Fatalf("look up k7: ok %v err %v", ok, err)
	}
	if st.Received != senders || st.Seq != seqs["k7"] {
		t.Errorf("k7 = %+v, want %d arrivals and seq %d", st, senders, seqs["k7"])
	}
}

// TestInboxBatchKeepsOrderAndOffsets commits one body holding three events,
// one of them a repeat of another: outcomes come back in order, the repeat
// as a duplicate of the first.
func TestInboxBatchKeepsOrderAndOffsets(t *testing.T) {
	in, _, _, log := openInbox(t, 1_000_000)
	body := []byte(`[{"id":"a"},{"id":"b"},{"id":"a"}]`)
	events := []Event{{Key: "a", Off: 1, Len: 10}, {Key: "b", Off: 12, Len: 10}, {Key: "a", Off: 23, Len: 10}}
	outs, err := in.Commit(context.Background(), "hooks", body, events)
	if err != nil {
		t.Fatal(err)
	}
	if !outs[0].New || !outs[1].New || outs[2].New || outs[2].Seq != outs[0].Seq {
		t.Fatalf("outcomes = %+v, want new, new, duplicate of the first", outs)
	}
	if got := string(log.frames[0].Events[1].Payload); got != `{"id":"b"}` {
		t.Errorf("second event payload = %q", got)
	}
}

// TestInboxBusyWhenQueueFull refuses a commit once the queue holds
// max_pending_events, storing nothing.
func TestInboxBusyWhenQueueFull(t *testing.T) {
	in, q, _, _ := openInbox(t, 2)
	for i := range 2 {
		body := fmt.Appendf(nil, `{"n":%d}`, i)
		if _, err := in.Commit(context.Background(), "hooks", body, []Event{{Key: fmt.Sprint(i), Len: len(body)}}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := in.Commit(context.Background(), "hooks", []byte(`{}`), []Event{{Key: "x", Len: 2}})
	var busy *BusyError
	if !errors.As(err, &busy) || busy.RetryAfter <= 0 {
		t.Fatalf("err = %v, want a BusyError with a Retry-After", err)
	}
	if _, ok, _ := q.EventByKey(context.Background(), "hooks", "x"); ok {
		t.Error("a refused event is in the ledger")
	}
	in.Close()
	if _, err := in.Commit(context.Background(), "hooks", []byte(`{}`), []Event{{Key: "y", Len: 2}}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: err = %v, want ErrClosed", err)
	}
}
