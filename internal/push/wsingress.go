package push

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/ingestorhq/ingestor/sources"
)

// wsIngress serves a kind "ws_ingress" source: GET /ingest/NAME/ws upgrades
// to a WebSocket on which a device sends envelopes and gets one answer per
// envelope (wsingress_conn.go; the envelopes and answers themselves are
// internal/devicewire's). Each connection is served by its own goroutines,
// so a slow or silent device holds up nobody else.
type wsIngress struct {
	env          handlerEnv
	maxMessage   int64
	window       int
	readTimeout  time.Duration
	pingInterval time.Duration
	writeTimeout time.Duration
	maxConns     int
	// shared is the SHA-256 of the shared token (hasShared); devices maps
	// the SHA-256 of each device token to its device id. Tokens are
	// compared as digests, in constant time for the shared one and by map
	// lookup of the digest for the per-device ones, and never logged.
	shared    [sha256.Size]byte
	hasShared bool
	devices   map[[sha256.Size]byte]string
	labels    deviceLabels
	// seqMu guards highSeq, the highest seq stored of each device with a
	// label of its own (ingestor_device_last_seq).
	seqMu   sync.Mutex
	highSeq map[string]int64

	mu      sync.Mutex
	closing bool
	conns   map[*wsConn]struct{}
	running sync.WaitGroup // connections being served
}

// maxAckWriteTimeout caps the time to write one answer, so that a device
// that does not read cannot hold a shutdown for long.
const maxAckWriteTimeout = 10 * time.Second

// tooManyRetryAfter is the Retry-After of a handshake refused at
// max_connections.
const tooManyRetryAfter = 5 * time.Second

func newWSIngress(env handlerEnv, spec *sources.WSIngressSpec) (handler, error) {
	if errs := spec.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("ws_ingress: %v", errs[0])
	}
	read, err := time.ParseDuration(spec.ReadTimeout)
	if err != nil {
		return nil, fmt.Errorf("ws_ingress: read_timeout: %w", err)
	}
	ping, err := time.ParseDuration(spec.PingInterval)
	if err != nil {
		return nil, fmt.Errorf("ws_ingress: ping_interval: %w", err)
	}
	h := &wsIngress{env: env, maxMessage: spec.MaxMessageBytes, window: spec.MaxInflight, readTimeout: read,
		pingInterval: ping, writeTimeout: min(read, maxAckWriteTimeout), maxConns: spec.MaxConnections,
		conns: make(map[*wsConn]struct{})}
	env.inbox.SetSeqGrace(env.source.Name, spec.SeqGrace())
	if spec.Token != "" {
		h.shared, h.hasShared = sha256.Sum256([]byte(spec.Token)), true
	}
	if spec.TokensFile != "" {
		byToken, err := sources.ReadDeviceTokens(spec.TokensFile)
		if err != nil {
			return nil, fmt.Errorf("ws_ingress: tokens_file: %w", err)
		}
		h.devices = make(map[[sha256.Size]byte]string, len(byToken))
		for token, device := range byToken {
			h.devices[sha256.Sum256([]byte(token))] = device
		}
	}
	// The series of a configured source exist from the start.
	env.metrics.ws.connected.WithLabelValues(env.source.Name).Set(0)
	return h, nil
}

// authenticate checks the handshake's bearer token. device is the id the
// token is bound to, or "" for the shared token (or no authentication
// configured). ok is false for a missing or wrong token.
func (h *wsIngress) authenticate(r *http.Request) (device string, ok bool) {
	if !h.hasShared && h.devices == nil {
		return "", true // no token configured: loopback only (config checks)
	}
	auth := r.Header.Get("Authorization")
	if len(auth) < len("Bearer ") || !strings.EqualFold(auth[:len("Bearer ")], "Bearer ") {
		return "", false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(auth[len("Bearer "):])))
	if h.hasShared && subtle.ConstantTimeCompare(sum[:], h.shared[:]) == 1 {
		return "", true
	}
	device, ok = h.devices[sum]
	return device, ok
}

// ServeHTTP authenticates the handshake, upgrades it and serves the
// connection until it ends.
func (h *wsIngress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	source := h.env.source.Name
	if r.PathValue("rest") != "ws" {
		h.refuse(w, http.StatusNotFound, fmt.Sprintf("ws_ingress source %q is served at /ingest/%s/ws", source, source))
		return
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		h.refuse(w, http.StatusMethodNotAllowed, "a WebSocket handshake is a GET")
		return
	}
	device, ok := h.authenticate(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="ingestor"`)
		h.refuse(w, http.StatusUnauthorized, "missing or wrong bearer token")
		h.env.log.Info("ws_ingress: handshake refused: missing or wrong bearer token", "remote", r.RemoteAddr)
		return
	}
	c := &wsConn{h: h, device: device, remote: r.RemoteAddr, stop: make(chan struct{}), slots: make(chan struct{}, h.window)}
	h.mu.Lock()
	switch {
	case h.closing:
		h.mu.Unlock()
		h.refuse(w, http.StatusServiceUnavailable, "the daemon is shutting down")
		return
	case len(h.conns) >= h.maxConns:
		h.mu.Unlock()
		w.Header().Set("Retry-After", strconv.Itoa(int(tooManyRetryAfter/time.Second)))
		h.refuse(w, http.StatusServiceUnavailable, fmt.Sprintf("ws_ingress source %q has max_connections (%d) open", source, h.maxConns))
		return
	}
	h.conns[c] = struct{}{}
	h.running.Add(1)
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.conns, c)
		h.mu.Unlock()
		h.running.Done()
	}()
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{OnPongReceived: c.pong})
	if err != nil {
		// Accept has answered the handshake with its error.
		h.env.metrics.Requests.WithLabelValues(source, strconv.Itoa(http.StatusBadRequest)).Inc()
		h.env.log.Debug("ws_ingress: handshake failed", "remote", r.RemoteAddr, "err", err)
		return
	}
	c.conn = conn
	c.serve()
}

// refuse answers a handshake with an error, counted in the request metrics.
func (h *wsIngress) refuse(w http.ResponseWriter, code int, msg string) {
	h.env.metrics.Requests.WithLabelValues(h.env.source.Name, strconv.Itoa(code)).Inc()
	WriteError(w, code, msg)
}

// Close stops reading every connection, waits for the envelopes already
// read to be committed and answered, and closes the connections with 1001.
func (h *wsIngress) Close() {
	h.mu.Lock()
	h.closing = true
	for c := range h.conns {
		c.shutdown()
	}
	h.mu.Unlock()
	h.running.Wait()
}

// lastSeq raises device's ingestor_device_last_seq to seq, a seq just
// stored, if the device has a label of its own; envelopes stored out of
// order never lower it.
func (h *wsIngress) lastSeq(device string, seq int64) {
	label := h.labels.label(device)
	if label == otherDevice {
		return
	}
	h.seqMu.Lock()
	defer h.seqMu.Unlock()
	if seq <= h.highSeq[label] {
		return
	}
	if h.highSeq == nil {
		h.highSeq = make(map[string]int64)
	}
	h.highSeq[label] = seq
	h.env.metrics.ws.lastSeq.WithLabelValues(h.env.source.Name, label).Set(float64(seq))
}
