package delivery

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/internal/rawstore"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/wire"
)

// ackRig is a real AckReceiver with a real SQLite queue and a running
// Sender, and a processor's PUSH socket connected to the receiver.
type ackRig struct {
	q     *queue.Queue
	reg   *prometheus.Registry
	zctx  *zmq.Context
	push  *zmq.Socket
	recv  *AckReceiver
	raw   rawstore.Store
	seq   int // frames appended so far, to name raw objects
	start func()
}

// newAckRig sets the rig up with the receiver bound to endpoint and maxBytes
// as its message limit. The receiver runs once start is called.
func newAckRig(t testing.TB, endpoint string, maxBytes int64) *ackRig {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	q, err := queue.Open(queue.Options{Path: filepath.Join(dir, "q.db"), EventsPerFrame: 3})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := rawstore.Open(ctx, rawstore.Options{URL: "file://" + filepath.Join(dir, "raw")})
	if err != nil {
		t.Fatal(err)
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	s, err := NewSender(zctx, q, raw, SenderOptions{Endpoint: fmt.Sprintf("inproc://sender-%p", t), HighWaterMark: 10,
		AckTimeout: time.Hour, Logger: log, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	recv, err := newTestReceiver(zctx, endpoint, maxBytes, q, s, log, m)
	if err != nil {
		t.Fatal(err)
	}
	if endpoint, err = recv.sock.GetLastEndpoint(); err != nil {
		t.Fatal(err)
	}
	push, err := zctx.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	if err := push.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := push.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 2)
	go func() { done <- s.Run(runCtx) }()
	running := 1
	r := &ackRig{q: q, reg: reg, zctx: zctx, push: push, recv: recv, raw: raw}
	r.start = func() {
		running++
		go func() { done <- recv.Run(runCtx) }()
	}
	t.Cleanup(func() {
		stop()
		for range running {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
		if running == 1 {
			if err := recv.close(); err != nil {
				t.Error(err)
			}
		}
		if err := push.Close(); err != nil {
			t.Error(err)
		}
		if err := zctx.Term(); err != nil {
			t.Error(err)
		}
		if err := q.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// newTestReceiver makes the receiver under test.
func newTestReceiver(zctx *zmq.Context, endpoint string, maxBytes int64, q *queue.Queue, s *Sender, log *slog.Logger, m *Metrics) (*AckReceiver, error) {
	return NewAckReceiver(zctx, AckOptions{Endpoint: endpoint, HighWaterMark: 1000, MaxMessageBytes: maxBytes, Logger: log, Metrics: m}, q, s)
}

// counter returns the value of the counter named name.
func (r *ackRig) counter(t testing.TB, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// frame queues one frame of events with the given keys, in source "src",
// with its raw object stored, and returns its id.
func (r *ackRig) frame(t testing.TB, keys ...string) int64 {
	t.Helper()
	r.seq++
	rawKey := fmt.Sprintf("src/%d", r.seq)
	var body []byte
	var evs []queue.NewEvent
	for _, k := range keys {
		evs = append(evs, queue.NewEvent{Key: k, RawOff: len(body), RawLen: len(k) + 2})
		body = append(body, `"`+k+`"`...)
	}
	if err := r.raw.Put(t.Context(), rawKey, body); err != nil {
		t.Fatal(err)
	}
	frames, err := r.q.Append(t.Context(), queue.Batch{Source: "src", RawKey: rawKey, FetchedAt: time.Now(), Events: evs})
	if err != nil || len(frames) != 1 {
		t.Fatalf("append %v: %d frames, %v", keys, len(frames), err)
	}
	return frames[0].ID
}

// send sends one ack message, one part per element of parts.
func (r *ackRig) send(t testing.TB, parts ...string) {
	t.Helper()
	for i, p := range parts {
		flag := zmq.Flag(0)
		if i < len(parts)-1 {
			flag = zmq.SNDMORE
		}
		if _, err := r.push.SendBytes([]byte(p), flag); err != nil {
			t.Fatalf("send ack part %d: %v", i, err)
		}
	}
}

// pendingKeys returns the keys of frame id still pending, nil if the frame
// is cleared.
func (r *ackRig) pendingKeys(t testing.TB, id int64) []string {
	t.Helper()
	f, ok, err := r.q.LoadFrame(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return nil
	}
	var keys []string
	for _, e := range f.Events {
		keys = append(keys, e.Key)
	}
	return keys
}

// deadKeys returns the keys of the dead letters, with their reasons.
func (r *ackRig) deadKeys(t testing.TB) map[string]string {
	t.Helper()
	dl, err := r.q.DeadLetters(t.Context(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range dl {
		out[d.Key] = d.Reason
	}
	return out
}

// sync sends a valid ack for a fresh frame of its own and waits until it
// is applied: every message sent before it has then been handled, as one
// PUSH socket delivers in order.
func (r *ackRig) sync(t testing.TB) {
	t.Helper()
	id := r.frame(t, fmt.Sprintf("sync-%d", r.seq))
	r.send(t, fmt.Sprintf(`{"v":1,"type":"ack","frames":[%d]}`, id))
	testsync.WaitFor(t, "the sync ack to be applied", 20*time.Second, func() bool { return r.pendingKeys(t, id) == nil })
}

// TestNackWinsOverFrameAck sends a frame ack and a nack for one event of
// that frame, in both JSON orders, with both kinds of nack, in one message
// and in two messages that the receiver settles in one burst (they are
// queued on an inproc socket before it starts). A nack in the same message
// as the ack, or in a later one, wins: the other events are acked, the
// nacked one is dead-lettered (permanent) or left pending with its reason
// (retryable). A retryable nack followed by a frame ack in a later message
// is overridden: the ack may be for a later delivery.
func TestNackWinsOverFrameAck(t *testing.T) {
	for _, permanent := range []bool{true, false} {
		for _, nackFirst := range []bool{true, false} {
			for _, split := range []bool{false, true} {
				name := fmt.Sprintf("permanent=%v/nack-first=%v/two-messages=%v", permanent, nackFirst, split)
				t.Run(name, func(t *testing.T) {
					endpoint := "tcp://127.0.0.1:*"
					if split {
						endpoint = fmt.Sprintf("inproc://acks-%p", t)
					}
					r := newAckRig(t, endpoint, 1<<20)
					if !split {
						r.start()
					}
					id := r.frame(t, "a", "poison", "c")
					frames := fmt.Sprintf(`"frames":[%d]`, id)
					nacks := fmt.Sprintf(`"nacks":[{"frame":%d,"source":"src","key":"poison","reason":"bad input","permanent":%v}]`, id, permanent)
					first, second := frames, nacks
					if nackFirst {
						first, second = nacks, frames
					}
					if split {
						r.send(t, `{"v":1,"type":"ack",`+first+`}`)
						r.send(t, `{"v":1,"type":"ack",`+second+`}`)
						r.start()
					} else {
						r.send(t, `{"v":1,"type":"ack",`+first+`,`+second+`}`)
					}
					r.sync(t)
					wantAcks := 2.0 // with the sync ack
					if split {
						wantAcks = 3
					}
					if got := r.counter(t, "ingestor_acks_received_total"); got != wantAcks {
						t.Fatalf("acks received = %v, want %v", got, wantAcks)
					}
					pending, dead := r.pendingKeys(t, id), r.deadKeys(t)
					switch {
					case permanent:
						if dead["poison"] != "bad input" || len(dead) != 1 || pending != nil {
							t.Fatalf("dead letters %v, pending %v: want the poison event dead-lettered and the frame cleared", dead, pending)
						}
					case split && nackFirst:
						if len(dead) != 0 || pending != nil {
							t.Fatalf("dead letters %v, pending %v: want the frame cleared by the later ack", dead, pending)
						}
					default:
						if len(dead) != 0 || !slices.Equal(pending, []string{"poison"}) {
							t.Fatalf("dead letters %v, pending %v: want only the poison event pending", dead, pending)
						}
						// Its reason was recorded: it is the last error of
						// a dead letter made now.
						if _, err := r.q.DeadLetterFrame(t.Context(), id, "test"); err != nil {
							t.Fatal(err)
						}
						if got := r.deadKeys(t)["poison"]; !strings.Contains(got, "bad input") {
							t.Fatalf("dead letter reason %q lacks the nack's reason", got)
						}
					}
				})
			}
		}
	}
}

// TestMultipartAckIsDropped sends a valid ack followed by garbage in one
// two-part message: the whole message is malformed, nothing is applied.
func TestMultipartAckIsDropped(t *testing.T) {
	r := newAckRig(t, "tcp://127.0.0.1:*", 1<<20)
	r.start()
	id := r.frame(t, "k0", "k1")
	r.send(t, fmt.Sprintf(`{"v":1,"type":"ack","frames":[%d]}`, id), "garbage")
	r.sync(t)
	if got := r.pendingKeys(t, id); !slices.Equal(got, []string{"k0", "k1"}) {
		t.Fatalf("pending = %v after a multi-part ack, want the frame untouched", got)
	}
	if got := r.counter(t, "ingestor_acks_malformed_total"); got != 1 {
		t.Fatalf("malformed acks = %v, want 1", got)
	}
}

// TestMalformedAcks sends each kind of malformed ack over TCP to the real
// receiver: each is counted as received and malformed and changes nothing,
// and the receiver goes on applying valid acks. Acks that only look odd
// (unknown fields, deep nesting within the limit, unknown frames) are
// accepted. PROTOCOL.md lists the same cases.
func TestMalformedAcks(t *testing.T) {
	deep := func(depth int) string { // an unknown field nested to depth in the ack
		return `{"v":1,"type":"ack","frames":[%[1]d],"x":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + `}`
	}
	manyFrames := `{"v":1,"type":"ack","frames":[%[1]d` + strings.Repeat(",1", wire.MaxAckEntries) + `]}`
	valid := `{"v":1,"type":"ack","frames":[%[1]d]}`
	for _, tc := range []struct {
		name  string
		parts []string // one message; %[1]d is the frame's id
		ok    bool     // a valid ack that clears the frame
	}{
		{"garbage", []string{`not json`}, false},
		{"empty", []string{``}, false},
		{"byte-order mark", []string{"\ufeff" + valid}, false},
		{"array", []string{`[` + valid + `]`}, false},
		{"null", []string{`null`}, false},
		{"string", []string{`"ack"`}, false},
		{"no v", []string{`{"type":"ack","frames":[%[1]d]}`}, false},
		{"v 2", []string{`{"v":2,"type":"ack","frames":[%[1]d]}`}, false},
		{"v string", []string{`{"v":"1","type":"ack","frames":[%[1]d]}`}, false},
		{"v 1.0", []string{`{"v":1.0,"type":"ack","frames":[%[1]d]}`}, false},
		{"v true", []string{`{"v":true,"type":"ack","frames":[%[1]d]}`}, false},
		{"v null", []string{`{"v":null,"type":"ack","frames":[%[1]d]}`}, false},
		{"type events", []string{`{"v":1,"type":"events","frames":[%[1]d]}`}, false},
		{"no type", []string{`{"v":1,"frames":[%[1]d]}`}, false},
		{"type not a string", []string{`{"v":1,"type":["ack"],"frames":[%[1]d]}`}, false},
		{"no lists", []string{`{"v":1,"type":"ack"}`}, false},
		{"empty lists", []string{`{"v":1,"type":"ack","frames":[],"keys":[],"nacks":[]}`}, false},
		{"frames not an array", []string{`{"v":1,"type":"ack","frames":%[1]d}`}, false},
		{"frames null", []string{`{"v":1,"type":"ack","frames":null,"keys":[{"frame":%[1]d,"source":"src","key":"k0"}]}`}, false},
		{"frame a string", []string{`{"v":1,"type":"ack","frames":[%[1]d,"x"]}`}, false},
		{"frame -1", []string{`{"v":1,"type":"ack","frames":[%[1]d,-1]}`}, false},
		{"frame 0", []string{`{"v":1,"type":"ack","frames":[%[1]d,0]}`}, false},
		{"frame null", []string{`{"v":1,"type":"ack","frames":[%[1]d,null]}`}, false},
		{"frame fraction", []string{`{"v":1,"type":"ack","frames":[%[1]d,1.5]}`}, false},
		{"frame exponent", []string{`{"v":1,"type":"ack","frames":[%[1]d,1e2]}`}, false},
		{"frame overflow", []string{`{"v":1,"type":"ack","frames":[%[1]d,9223372036854775808]}`}, false},
		{"frame an object", []string{`{"v":1,"type":"ack","frames":[{"frame":%[1]d}]}`}, false},
		{"key empty object", []string{`{"v":1,"type":"ack","frames":[%[1]d],"keys":[{}]}`}, false},
		{"key without key", []string{`{"v":1,"type":"ack","frames":[%[1]d],"keys":[{"frame":%[1]d,"source":"src"}]}`}, false},
		{"key without frame", []string{`{"v":1,"type":"ack","frames":[%[1]d],"keys":[{"source":"src","key":"k0"}]}`}, false},
		{"key source a number", []string{`{"v":1,"type":"ack","keys":[{"frame":%[1]d,"source":1,"key":"k0"}]}`}, false},
		{"key frame a string", []string{`{"v":1,"type":"ack","keys":[{"frame":"%[1]d","source":"src","key":"k0"}]}`}, false},
		{"key a string", []string{`{"v":1,"type":"ack","frames":[%[1]d],"keys":["k0"]}`}, false},
		{"nack without reason", []string{`{"v":1,"type":"ack","frames":[%[1]d],"nacks":[{"frame":%[1]d,"source":"src","key":"k0"}]}`}, false},
		{"nack reason null", []string{`{"v":1,"type":"ack","nacks":[{"frame":%[1]d,"source":"src","key":"k0","reason":null}]}`}, false},
		{"nack permanent a string", []string{`{"v":1,"type":"ack","nacks":[{"frame":%[1]d,"source":"src","key":"k0","reason":"x","permanent":"yes"}]}`}, false},
		{"duplicate field", []string{`{"v":1,"type":"ack","frames":[%[1]d],"frames":[%[1]d]}`}, false},
		{"duplicate entry field", []string{`{"v":1,"type":"ack","keys":[{"frame":%[1]d,"source":"src","key":"k0","key":"k1"}]}`}, false},
		{"trailing data", []string{valid + ` x`}, false},
		{"two objects", []string{valid + valid}, false},
		{"invalid UTF-8", []string{`{"v":1,"type":"ack","frames":[%[1]d],"x":"` + "\xff" + `"}`}, false},
		{"truncated", []string{`{"v":1,"type":"ack","frames":[%[1]d`}, false},
		{"nested too deep", []string{deep(wire.MaxAckDepth + 1)}, false},
		{"too many entries", []string{manyFrames}, false},
		{"multi-part", []string{valid, `garbage`}, false},
		{"multi-part of valid acks", []string{valid, valid}, false},

		{"valid", []string{valid}, true},
		{"nested to the limit", []string{deep(wire.MaxAckDepth)}, true},
		{"unknown fields everywhere", []string{`{"v":1,"type":"ack","x":{"y":[1,{}]},"frames":[%[1]d],"keys":[{"frame":%[1]d,"source":"src","key":"k0","x":null}],"nacks":[],"V":2}`}, true},
		{"escaped field names", []string{`{"\u0076":1,"typ\u0065":"ack","fr\u0061mes":[%[1]d]}`}, true},
		{"unknown frames", []string{`{"v":1,"type":"ack","frames":[%[1]d,9223372036854775807]}`}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newAckRig(t, "tcp://127.0.0.1:*", defaultAckLimit)
			r.start()
			id := r.frame(t, "k0", "k1")
			parts := make([]string, len(tc.parts))
			for i, p := range tc.parts {
				if strings.Contains(p, "%[1]d") {
					p = fmt.Sprintf(p, id)
				}
				parts[i] = p
			}
			r.send(t, parts...)
			r.sync(t)
			if got := r.counter(t, "ingestor_acks_received_total"); got != 2 {
				t.Errorf("acks received = %v, want 2 with the sync ack", got)
			}
			bad := r.counter(t, "ingestor_acks_malformed_total")
			pending := r.pendingKeys(t, id)
			if tc.ok {
				if bad != 0 || pending != nil {
					t.Fatalf("malformed = %v, pending %v: want the ack applied", bad, pending)
				}
				return
			}
			if bad != 1 || !slices.Equal(pending, []string{"k0", "k1"}) {
				t.Fatalf("malformed = %v, pending %v: want 1 and the frame untouched", bad, pending)
			}
		})
	}
}

// TestOversizeAckDropsTheConnection sends an ack one byte over the
// socket's limit: ZeroMQ drops the connection before the daemon reads it,
// so it is neither received nor malformed, and nothing is applied. The
// processor's socket reconnects by itself, and its next ack is applied; an
// ack of exactly the limit is accepted.
func TestOversizeAckDropsTheConnection(t *testing.T) {
	const limit = 64 << 10
	r := newAckRig(t, "tcp://127.0.0.1:*", limit)
	r.start()
	mon := fmt.Sprintf("inproc://monitor-%p", t)
	if err := r.push.Monitor(mon, zmq.EVENT_CONNECTED|zmq.EVENT_DISCONNECTED); err != nil {
		t.Fatal(err)
	}
	events, err := r.zctx.NewSocket(zmq.PAIR)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := events.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := events.SetRcvtimeo(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := events.Connect(mon); err != nil {
		t.Fatal(err)
	}
	r.sync(t) // connected by now
	padded := func(id int64, size int) string {
		head := fmt.Sprintf(`{"v":1,"type":"ack","frames":[%d],"pad":"`, id)
		return head + strings.Repeat("x", size-len(head)-2) + `"}`
	}
	id := r.frame(t, "k0", "k1")
	r.send(t, padded(id, limit+1))
	for _, want := range []zmq.Event{zmq.EVENT_DISCONNECTED, zmq.EVENT_CONNECTED} {
		for {
			ev, _, _, err := events.RecvEvent(0)
			if err != nil {
				t.Fatalf("waiting for %v: %v", want, err)
			}
			if ev == want {
				break
			}
		}
	}
	r.sync(t)
	if got := r.pendingKeys(t, id); !slices.Equal(got, []string{"k0", "k1"}) {
		t.Fatalf("pending = %v after an oversize ack, want the frame untouched", got)
	}
	if rec, bad := r.counter(t, "ingestor_acks_received_total"), r.counter(t, "ingestor_acks_malformed_total"); rec != 2 || bad != 0 {
		t.Fatalf("received %v, malformed %v: want the two sync acks and no malformed one", rec, bad)
	}
	// The daemon saw the disconnection.
	testsync.WaitFor(t, "the disconnection to be counted", 20*time.Second, func() bool { return r.counter(t, "ingestor_ack_disconnects_total") == 1 })
	r.send(t, padded(id, limit))
	testsync.WaitFor(t, "an ack of exactly the limit to be applied", 20*time.Second, func() bool { return r.pendingKeys(t, id) == nil })
}

// maximalAck returns an ack of as many key acks naming unknown events of
// pending frame id as fit in size bytes, at most wire.MaxAckEntries, each
// key keyBytes long, padded with an unknown field to size bytes, and the
// number of key acks. Long keys make the slowest ack to settle: each key
// is decoded and looked up.
func maximalAck(id int64, keyBytes, size int) (string, int) {
	var b strings.Builder
	b.WriteString(`{"v":1,"type":"ack","keys":[`)
	const tail = `],"pad":""}`
	pad := strings.Repeat("p", keyBytes-len("unknown-00000-"))
	n := 0
	for ; n < wire.MaxAckEntries; n++ {
		entry := fmt.Sprintf(`{"frame":%d,"source":"src","key":"unknown-%05d-%s"}`, id, n, pad)
		if b.Len()+1+len(entry)+len(tail) > size {
			break
		}
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(entry)
	}
	b.WriteString(`],"pad":"`)
	b.WriteString(strings.Repeat("p", max(size-b.Len()-2, 0)))
	b.WriteString(`"}`)
	return b.String(), n
}

// defaultAckLimit is publish.ack_max_message_bytes with the default
// settings (config.DefaultAckMaxMessageBytes(1024, 100)).
const defaultAckLimit = 4 << 20

// ackAfterMaximal sends a maximal ack, then right after it a valid ack of
// a frame of its own, and returns how long the valid one took to be
// applied.
func ackAfterMaximal(t testing.TB, r *ackRig, maximal string) time.Duration {
	id := r.frame(t, fmt.Sprintf("m%d-0", r.seq), fmt.Sprintf("m%d-1", r.seq))
	r.send(t, maximal)
	start := time.Now()
	r.send(t, fmt.Sprintf(`{"v":1,"type":"ack","frames":[%d]}`, id))
	testsync.WaitFor(t, "the ack after the maximal one to be applied", 20*time.Second, func() bool { return r.pendingKeys(t, id) == nil })
	return time.Since(start)
}

// TestMaximalAckDoesNotStarveOthers measures how long a valid ack sent
// right after a maximal one waits: the maximal one (the default limit,
// filled with key acks of 200 bytes, which makes about the most entries,
// wire.MaxAckEntries, with the longest keys) is decoded and settled on its
// own, as a burst closes at wire.MaxAckEntries entries, with one lookup
// statement per kind of entry. BenchmarkAckAfterMaximal measures it
// without the race detector (make bench). The bound here is loose, for
// -race on busy machines; before the limits, such an ack held the others
// up for seconds, and a bigger one for minutes.
func TestMaximalAckDoesNotStarveOthers(t *testing.T) {
	r := newAckRig(t, "tcp://127.0.0.1:*", defaultAckLimit)
	r.start()
	maximal, entries := maximalAck(r.frame(t, "p0", "p1"), 200, defaultAckLimit)
	if len(maximal) != defaultAckLimit || entries < wire.MaxAckEntries*9/10 {
		t.Fatalf("the maximal ack is %d bytes with %d entries, want %d bytes and about %d", len(maximal), entries, defaultAckLimit, wire.MaxAckEntries)
	}
	took := ackAfterMaximal(t, r, maximal)
	t.Logf("a valid ack sent right after a maximal one (%d entries, %d bytes) was applied %v later", entries, len(maximal), took)
	if took > 10*time.Second {
		t.Errorf("the valid ack waited %v", took)
	}
	if got := r.counter(t, "ingestor_acks_unknown_total"); got != float64(entries) {
		t.Errorf("unknown acks = %v, want %d", got, entries)
	}
}

// BenchmarkAckAfterMaximal reports, per op, how long a valid ack sent
// right after a maximal ack of the default size limit takes to be
// applied, for keys of 20 bytes (16384 entries, the rest of the ack an
// unknown field), 200 bytes (about the most entries with the longest
// keys) and 470 bytes (fewer, longer keys).
func BenchmarkAckAfterMaximal(b *testing.B) {
	for _, keyBytes := range []int{20, 200, 470} {
		b.Run(fmt.Sprintf("key-bytes=%d", keyBytes), func(b *testing.B) {
			r := newAckRig(b, "tcp://127.0.0.1:*", defaultAckLimit)
			r.start()
			maximal, _ := maximalAck(r.frame(b, "p0", "p1"), keyBytes, defaultAckLimit)
			for b.Loop() {
				ackAfterMaximal(b, r, maximal)
			}
		})
	}
}
