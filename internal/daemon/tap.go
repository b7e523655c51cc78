package daemon

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingestorhq/ingestor/internal/adminapi"
	"github.com/ingestorhq/ingestor/internal/tap"
)

// Timing of a tap session (GET /tap).
const (
	// defaultTapMaxBytes is how much of each payload a session gets when
	// it does not say.
	defaultTapMaxBytes = 200
	// tapWriteTimeout is how long one batch of lines may take to write: a
	// client that takes nothing for that long is disconnected. It
	// replaces the listener's write timeout, which would end every
	// session after it.
	tapWriteTimeout = 30 * time.Second
	// defaultTapKeepalive is how often an idle session gets an empty
	// line, so that a client gone away is noticed.
	defaultTapKeepalive = 15 * time.Second
	// tapEndGrace is how long a session ended by the daemon has to write
	// its last line before a write in progress is cut off.
	tapEndGrace = time.Second
)

// newTap makes the hub that Ingest hands every commit to, with its
// metrics. Start registers its close after the ops listeners, so that the
// sessions end before the listeners stop and do not hold their shutdown.
func (d *Daemon) newTap(keepalive time.Duration) {
	dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "ingestor_tap_dropped_events_total",
		Help: "Events not sent to a tap session (ingestor tap, GET /tap) because its buffer was full: its reader was too slow. Only the session misses them: the pipeline never waits for a tap."})
	hub := tap.New(tap.Options{OnDrop: func(n int) { dropped.Add(float64(n)) }})
	d.reg.MustRegister(dropped, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ingestor_tap_sessions",
		Help: "Tap sessions open (ingestor tap, GET /tap); at most 4 at once."}, func() float64 { return float64(hub.Sessions()) }))
	d.tap = hub
	d.tapKeepalive = keepalive
	if d.tapKeepalive <= 0 {
		d.tapKeepalive = defaultTapKeepalive
	}
}

// parseTapQuery reads the sources (source=A, repeated or comma-separated;
// every source when none) and max_bytes of a GET /tap. A source must be
// configured.
func (d *Daemon) parseTapQuery(v url.Values) (sources []string, maxBytes int, err error) {
	known := map[string]bool{}
	var names []string
	for _, s := range d.currentConfig().Sources {
		known[s.Name] = true
		names = append(names, s.Name)
	}
	for _, list := range v["source"] {
		for _, name := range strings.Split(list, ",") {
			if name = strings.TrimSpace(name); name == "" {
				continue
			}
			if !known[name] {
				return nil, 0, fmt.Errorf("unknown source %q: the configured sources are %s", name, strings.Join(names, ", "))
			}
			sources = append(sources, name)
		}
	}
	maxBytes = defaultTapMaxBytes
	if s := v.Get("max_bytes"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > tap.MaxPayloadBytes {
			return nil, 0, fmt.Errorf("max_bytes %q: want a number from 0 to %d", s, tap.MaxPayloadBytes)
		}
		maxBytes = n
	}
	return sources, maxBytes, nil
}

// handleTap is GET /tap: it streams the events committed from now on, of
// the sources asked (all by default), as NDJSON lines (adminapi.TapPath).
// The session's buffer is bounded (tap.BufferEvents, tap.BufferBytes):
// when its client reads too slowly, the events that do not fit are
// dropped for it and a "dropped" line says how many.
func (d *Daemon) handleTap(w http.ResponseWriter, r *http.Request) {
	sources, maxBytes, err := d.parseTapQuery(r.URL.Query())
	if err != nil {
		d.writeError(w, http.StatusBadRequest, err)
		return
	}
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Type", "application/x-ndjson")
		return // no session: a HEAD gets no body
	}
	sub, err := d.tap.Subscribe(sources, maxBytes)
	switch {
	case errors.Is(err, tap.ErrBusy):
		w.Header().Set("Retry-After", "5")
		d.writeError(w, http.StatusServiceUnavailable, fmt.Errorf("%d tap sessions are open, the most the daemon serves at once: end one and try again", d.tap.MaxSessions()))
		return
	case err != nil:
		d.writeError(w, http.StatusServiceUnavailable, errors.New("the daemon is stopping"))
		return
	}
	defer sub.Close()
	d.log.Info("tap session started", "remote", r.RemoteAddr, "sources", sources, "max_bytes", maxBytes)
	if sources == nil {
		sources = []string{} // every source: [] in the start line
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // payloads read as they are: "<" stays "<"
	s := &tapSession{w: w, rc: http.NewResponseController(w), enc: enc, sub: sub}
	defer s.cutOffWhenEnded()()
	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	err = s.write(adminapi.TapStart{Type: adminapi.TapTypeStart, Sources: sources, MaxBytes: sub.MaxBytes(),
		BufferEvents: tap.BufferEvents, BufferBytes: tap.BufferBytes})
	if err == nil {
		err = s.run(r, d.tapKeepalive)
	}
	d.log.Info("tap session ended", "remote", r.RemoteAddr, "sent", s.sent, "dropped", s.dropped, "err", err)
}

// tapSession writes one GET /tap stream.
type tapSession struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	enc *json.Encoder
	sub *tap.Subscriber
	// ended is set once the daemon ended the session: writes from then
	// on get tapEndGrace at most.
	ended atomic.Bool
	// sent and dropped count the session's events, for its log line.
	sent, dropped int64
}

// run writes the session's lines until its client goes away, a write
// fails or the daemon ends it.
func (s *tapSession) run(r *http.Request, keepalive time.Duration) error {
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	var err error
	for err == nil {
		select {
		case <-r.Context().Done():
			return r.Context().Err()
		case <-s.sub.Done():
			return s.write(adminapi.TapEnd{Type: adminapi.TapTypeEnd, Reason: "the daemon is stopping"})
		case <-s.sub.Ready():
			err = s.batch()
		case <-tick.C:
			err = s.write(nil)
		}
	}
	return err
}

// batch writes the events taken from the buffer, then how many were
// dropped after them, and flushes.
func (s *tapSession) batch() error {
	events, dropped := s.sub.Take()
	s.deadline()
	for _, ev := range events {
		if err := s.enc.Encode(tapLine(ev)); err != nil {
			return err
		}
	}
	s.sent += int64(len(events))
	if dropped > 0 {
		s.dropped += dropped
		if err := s.enc.Encode(adminapi.TapDropped{Type: adminapi.TapTypeDropped, Dropped: dropped}); err != nil {
			return err
		}
	}
	return s.rc.Flush()
}

// write writes one line, v as JSON or an empty line for nil, and flushes.
func (s *tapSession) write(v any) error {
	s.deadline()
	var err error
	if v == nil {
		_, err = s.w.Write([]byte("\n"))
	} else {
		err = s.enc.Encode(v)
	}
	if err != nil {
		return err
	}
	return s.rc.Flush()
}

// deadline gives the writes that follow tapWriteTimeout, or tapEndGrace
// once the session was ended.
func (s *tapSession) deadline() {
	if s.ended.Load() {
		return // cutOffWhenEnded set it
	}
	_ = s.rc.SetWriteDeadline(time.Now().Add(tapWriteTimeout))
	if s.ended.Load() {
		// Ended meanwhile: its deadline may have been set before this
		// one, which must not extend it.
		_ = s.rc.SetWriteDeadline(time.Now().Add(tapEndGrace))
	}
}

// cutOffWhenEnded makes a write in progress, or to come, fail after
// tapEndGrace once the daemon ends the session, so that a client that
// reads nothing does not hold the daemon's stop for tapWriteTimeout. It
// returns the function that stops watching, to call before the handler
// returns.
func (s *tapSession) cutOffWhenEnded() (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-quit:
		case <-s.sub.Done():
			s.ended.Store(true)
			_ = s.rc.SetWriteDeadline(time.Now().Add(tapEndGrace))
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// tapLine is the NDJSON line of ev: its payload's first bytes as text, cut
// at a character boundary, or in base64 when they are not UTF-8.
func tapLine(ev tap.Event) adminapi.TapEvent {
	p := ev.Payload
	if len(p) < ev.Size {
		// Cut off inside a character: drop its first bytes too.
		for i := 1; i <= utf8.UTFMax && i <= len(p); i++ {
			if utf8.RuneStart(p[len(p)-i]) {
				if !utf8.FullRune(p[len(p)-i:]) {
					p = p[:len(p)-i]
				}
				break
			}
		}
	}
	line := adminapi.TapEvent{Type: adminapi.TapTypeEvent, Source: ev.Source, Key: ev.Key, Seq: ev.Seq,
		CommittedAt: ev.CommittedAt.UTC(), FetchedAt: ev.FetchedAt.UTC(), EventTime: ev.EventTime.UTC(), Size: ev.Size}
	if utf8.Valid(p) {
		text := string(p)
		line.Payload = &text
	} else {
		p = ev.Payload
		line.PayloadB64 = base64.StdEncoding.EncodeToString(p)
	}
	line.Truncated = len(p) < ev.Size
	return line
}
