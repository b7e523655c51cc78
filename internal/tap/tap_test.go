package tap

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/ingestorhq/ingestor/internal/queue"
)

// frame returns a frame of source with n events numbered from first, each
// with a payload of size bytes.
func frame(source string, first, n, size int) queue.Frame {
	f := queue.Frame{Source: source}
	for i := range n {
		seq := first + i
		f.Events = append(f.Events, queue.Event{Seq: int64(seq), Source: source, Key: fmt.Sprintf("k%d", seq),
			Payload: bytes.Repeat([]byte{'x'}, size)})
	}
	return f
}

// TestTapCommittedWithoutSubscribersCostsNothing: with no subscriber, a
// commit's hand-over allocates nothing (it loads one pointer); after the
// last subscriber leaves, the same.
func TestTapCommittedWithoutSubscribersCostsNothing(t *testing.T) {
	h := New(Options{})
	frames := []queue.Frame{frame("a", 1, 100, 500)}
	if n := testing.AllocsPerRun(1000, func() { h.Committed(frames) }); n != 0 {
		t.Errorf("Committed without a subscriber: %v allocations, want 0", n)
	}
	s, err := h.Subscribe(nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if n := testing.AllocsPerRun(1000, func() { h.Committed(frames) }); n != 0 {
		t.Errorf("Committed after the last subscriber left: %v allocations, want 0", n)
	}
	if h.Sessions() != 0 {
		t.Errorf("%d sessions after Close, want 0", h.Sessions())
	}
}

// TestTapBufferIsBoundedAndDropsAfter: a subscriber nobody reads keeps
// BufferEvents events, copies only max bytes of each payload, filters by
// source, and counts the rest as dropped, reported after the events it
// kept; after Take it buffers again. Its hub takes MaxSessions
// subscribers, and closing the hub ends them.
func TestTapBufferIsBoundedAndDropsAfter(t *testing.T) {
	var onDrop int
	h := New(Options{MaxSessions: 2, OnDrop: func(n int) { onDrop += n }})
	s, err := h.Subscribe([]string{"a"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Subscribe(nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Subscribe(nil, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("third Subscribe of 2 allowed: %v, want ErrBusy", err)
	}
	h.Committed([]queue.Frame{frame("b", 1, 10, 100), frame("a", 11, BufferEvents+5, 100)})
	<-s.Ready()
	evs, dropped := s.Take()
	// OnDrop counts both subscribers' drops: 5 here, 15 for the other,
	// which takes every source.
	if len(evs) != BufferEvents || dropped != 5 || onDrop != 20 {
		t.Fatalf("took %d events, %d dropped (OnDrop %d); want %d, 5 and 20", len(evs), dropped, onDrop, BufferEvents)
	}
	if e := evs[0]; e.Source != "a" || e.Seq != 11 || string(e.Payload) != "xxx" || e.Size != 100 || !e.Truncated() || cap(e.Payload) > 8 {
		t.Errorf("first event %+v (payload cap %d); want source a, seq 11, 3 of 100 bytes copied", e, cap(e.Payload))
	}
	h.Committed([]queue.Frame{frame("a", 2000, 1, 2)})
	<-s.Ready()
	evs, dropped = s.Take()
	if len(evs) != 1 || dropped != 0 || evs[0].Truncated() {
		t.Errorf("after Take: %d events, %d dropped; want 1 whole one and none dropped", len(evs), dropped)
	}
	h.Close()
	select {
	case <-s.Done():
	default:
		t.Error("subscriber not ended by the hub's Close")
	}
	if _, err := h.Subscribe(nil, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Subscribe after Close: %v, want ErrClosed", err)
	}
}

// TestTapBufferIsBoundedInBytes: payloads at MaxPayloadBytes fill the
// byte bound before the event bound.
func TestTapBufferIsBoundedInBytes(t *testing.T) {
	h := New(Options{})
	s, err := h.Subscribe(nil, MaxPayloadBytes*2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.MaxBytes() != MaxPayloadBytes {
		t.Errorf("MaxBytes %d, want it capped at %d", s.MaxBytes(), MaxPayloadBytes)
	}
	h.Committed([]queue.Frame{frame("a", 1, 40, MaxPayloadBytes+10)})
	evs, dropped := s.Take()
	kept := 0
	for _, e := range evs {
		kept += len(e.Payload) + len(e.Key)
	}
	if kept > BufferBytes || len(evs)+int(dropped) != 40 || dropped == 0 {
		t.Errorf("kept %d events of %d bytes, dropped %d; want at most %d bytes and the rest dropped", len(evs), kept, dropped, BufferBytes)
	}
}
