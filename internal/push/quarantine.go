package push

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingestorhq/ingestor/internal/queue"
	"github.com/ingestorhq/ingestor/sources"
)

// The reasons of ingestor_webhook_rejected_total and of the quarantine.
const (
	reasonBadSignature     = "bad_signature"
	reasonMissingSignature = "missing_signature"
	reasonStaleTimestamp   = "stale_timestamp"
	reasonBadToken         = "bad_token"
	reasonMissingToken     = "missing_token"
	reasonContentType      = "content_type"
	reasonTooLarge         = "too_large"
	reasonBodyTimeout      = "body_timeout"
	reasonInvalidBody      = "invalid_body"
	reasonInvalidKey       = "invalid_key"
	reasonMethod           = "method"
	reasonCIDR             = "cidr"
	reasonClientCert       = "client_cert"
)

// quarantineBuffer is how many refused deliveries may wait for the
// quarantine's writer; beyond it they are dropped and counted, so a flood
// of bad requests never waits for SQLite nor grows memory.
const quarantineBuffer = 64

// quarantine keeps refused webhook deliveries in the queue database
// (queue.Rejected) off the path of every answer: put hands a delivery to a
// small buffer, or drops it when the buffer is full, and one goroutine
// writes what the buffer holds as one lazy request of the queue's writer.
type quarantine struct {
	q       *queue.Queue
	ch      chan queue.Rejected
	stop    chan struct{}
	done    chan struct{}
	dropped *prometheus.CounterVec
	log     *slog.Logger
}

func newQuarantine(q *queue.Queue, m *Metrics, log *slog.Logger) *quarantine {
	k := &quarantine{q: q, ch: make(chan queue.Rejected, quarantineBuffer), stop: make(chan struct{}), done: make(chan struct{}),
		dropped: m.quarantineDropped, log: log}
	go k.run()
	return k
}

// put hands r to the writer without waiting, or drops and counts it when
// the buffer is full.
func (k *quarantine) put(r queue.Rejected) {
	select {
	case k.ch <- r:
	default:
		k.dropped.WithLabelValues(r.Source).Inc()
	}
}

func (k *quarantine) run() {
	defer close(k.done)
	batch := make([]queue.Rejected, 0, quarantineBuffer)
	for {
		select {
		case r := <-k.ch:
			batch = append(batch[:0], r)
		case <-k.stop:
			// What is buffered is written before the queue closes.
			batch = batch[:0]
			for len(k.ch) > 0 {
				batch = append(batch, <-k.ch)
			}
			k.write(batch)
			return
		}
		for len(batch) < cap(batch) && len(k.ch) > 0 {
			batch = append(batch, <-k.ch)
		}
		k.write(batch)
	}
}

// write stores batch; a failure is logged, never answered.
func (k *quarantine) write(batch []queue.Rejected) {
	if len(batch) == 0 {
		return
	}
	if err := k.q.Quarantine(context.Background(), batch); err != nil {
		k.log.Warn("webhook quarantine: store refused deliveries", "deliveries", len(batch), "err", err)
	}
}

// close writes what the buffer holds and stops the writer; later puts are
// lost.
func (k *quarantine) close() {
	close(k.stop)
	<-k.done
}

// rejections records the refused deliveries of one webhook source: counts
// them by reason and, unless its quarantine_size is 0, quarantines them.
type rejections struct {
	source  string
	keep    int
	bodyCap int
	// quarantine is nil when the source keeps none.
	quarantine *quarantine
	counts     *prometheus.CounterVec
}

func newRejections(env handlerEnv, spec *sources.WebhookSpec) *rejections {
	k := &rejections{source: env.source.Name, keep: spec.QuarantineSize, bodyCap: spec.QuarantineBodyBytes, counts: env.metrics.rejected}
	if k.keep > 0 {
		k.quarantine = env.quarantine
	}
	return k
}

// record counts a refused delivery and quarantines it: body is what was
// read of its body (nil when it was refused unread), whole whether that
// is all of it.
func (k *rejections) record(r *http.Request, reqID string, code int, reason, detail string, body []byte, whole bool) {
	k.counts.WithLabelValues(k.source, reason).Inc()
	if k.quarantine == nil {
		return
	}
	whole = whole || body == nil && r.ContentLength == 0
	if len(body) > k.bodyCap {
		body, whole = body[:k.bodyCap], false
	}
	k.quarantine.put(queue.Rejected{Source: k.source, At: time.Now(), Reason: reason, Detail: detail, Code: code,
		RequestID: reqID, Remote: r.RemoteAddr, Method: r.Method, Path: r.URL.Path, Headers: redacted(r.Header),
		Body: append([]byte{}, body...), Truncated: !whole, Keep: k.keep})
}

// redactedValue replaces the value of a header that may hold a secret.
const redactedValue = "[redacted]"

// redacted returns a copy of h whose headers that may hold a secret have
// their values replaced by redactedValue: Cookie, and any whose name holds
// "signature", "token", "secret", "key" or "auth" (Authorization), in any
// case.
func redacted(h http.Header) map[string][]string {
	out := make(map[string][]string, len(h))
	for name, vals := range h {
		if secretHeader(name) {
			red := make([]string, len(vals))
			for i := range red {
				red[i] = redactedValue
			}
			out[name] = red
			continue
		}
		out[name] = append([]string(nil), vals...)
	}
	return out
}

// secretHeader reports whether the header name may hold a secret.
func secretHeader(name string) bool {
	n := strings.ToLower(name)
	if n == "cookie" {
		return true
	}
	for _, part := range []string{"signature", "token", "secret", "key", "auth"} {
		if strings.Contains(n, part) {
			return true
		}
	}
	return false
}
