package push

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/httpstop"
	"github.com/ingestorhq/ingestor/sources"
)

// ServerOptions configure a Server.
type ServerOptions struct {
	// Push is the [push] section: address and TLS.
	Push config.Push
	// Sources are the configured sources; the enabled push kinds among
	// them are served.
	Sources []config.Source
	Inbox   *Inbox
	Logger  *slog.Logger
	Metrics *Metrics
	// Registry takes the metrics a kind's handler adds (nil: none).
	Registry prometheus.Registerer
	// Limiters are the named limiters ([rate_limiters.NAME]) that a
	// source's rate_limiter names.
	Limiters *sources.RateLimiters
	// OnRequest, when set, is called with the source's name for every
	// request to an enabled source, before its guard (the status page's
	// last request).
	OnRequest func(source string)
	// Tracing, when set, traces every request but WebSocket upgrades as a
	// server span (continuing a W3C traceparent header), and each device
	// envelope; nil traces nothing.
	Tracing trace.TracerProvider
}

// Server is the push listener: /ingest/NAME and below, for each enabled
// push source.
type Server struct {
	o      ServerOptions
	srv    *http.Server
	conns  *httpstop.Conns // srv's connections, for Shutdown
	ln     net.Listener
	routes atomic.Pointer[routes]
	// quarantine keeps the refused deliveries of webhook sources
	// (quarantine.go); nil without an inbox.
	quarantine *quarantine
	log        *slog.Logger
	closing    atomic.Bool
	done       chan struct{}
	onRequest  func(source string)
}

// routes are the served push sources: their handlers and the guard of
// each that has one. A reload replaces them as a whole, so a request sees
// one source's handler and guard from the same config.
type routes struct {
	handlers map[string]handler
	guards   map[string]*guard
}

// handler serves one push source. Close runs once the listener stopped
// taking requests: a handler that keeps connections of its own (WebSocket)
// finishes what they sent and closes them.
type handler interface {
	http.Handler
	Close()
}

// handlerEnv is what a kind's handler is built with.
type handlerEnv struct {
	source  config.Source
	inbox   *Inbox
	log     *slog.Logger // carries the source name
	metrics *Metrics
	reg     prometheus.Registerer
	// loopback reports that the push listener is on a loopback address.
	loopback bool
	// quarantine is the listener's quarantine (nil without an inbox).
	quarantine *quarantine
	// tracing traces each device envelope; nil with tracing off.
	tracing trace.TracerProvider
}

// Limits of the push listener's connections. A webhook handler bounds the
// time to read its body itself (WebSocket connections are long-lived).
const (
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
)

// Start listens on o.Push.Addr and serves the enabled push sources of
// o.Sources.
func Start(o ServerOptions) (*Server, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	s := &Server{o: o, log: o.Logger, done: make(chan struct{}), onRequest: o.OnRequest}
	if o.Inbox != nil {
		s.quarantine = newQuarantine(o.Inbox.o.Queue, o.Metrics, o.Logger)
	}
	r := &routes{handlers: make(map[string]handler), guards: make(map[string]*guard)}
	for _, src := range o.Sources {
		if err := s.addRoute(r, src, o.Limiters); err != nil {
			r.close()
			s.closeQuarantine()
			return nil, err
		}
	}
	s.routes.Store(r)
	mux := http.NewServeMux()
	mux.HandleFunc("/ingest/{name}", s.dispatch)
	mux.HandleFunc("/ingest/{name}/{rest...}", s.dispatch)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		WriteError(w, http.StatusNotFound, "not found: push sources are served under /ingest/NAME")
	})
	s.srv = &http.Server{Handler: traced(mux, o.Tracing), ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idleTimeout,
		MaxHeaderBytes: maxHeaderBytes, ErrorLog: slog.NewLogLogger(o.Logger.Handler(), slog.LevelDebug)}
	s.conns = httpstop.Track(s.srv)
	ln, err := net.Listen("tcp", o.Push.Addr)
	if err != nil {
		s.closeHandlers()
		return nil, fmt.Errorf("push listen %s: %w", o.Push.Addr, err)
	}
	if o.Push.TLSCertFile != "" {
		conf, err := serverTLS(o.Push)
		if err != nil {
			s.closeHandlers()
			return nil, errors.Join(err, ln.Close())
		}
		ln = tls.NewListener(ln, conf)
	}
	s.ln = ln
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("push listener stopped", "err", err)
		}
	}()
	return s, nil
}

// addRoute adds the handler and guard of src to r, if src is an enabled
// push source; limiters are the named limiters its rate_limiter may name.
func (s *Server) addRoute(r *routes, src config.Source, limiters *sources.RateLimiters) error {
	if !src.Enabled {
		return nil
	}
	o := s.o
	env := handlerEnv{source: src, inbox: o.Inbox, log: o.Logger.With("source", src.Name), metrics: o.Metrics, reg: o.Registry,
		loopback: config.LoopbackAddr(o.Push.Addr), quarantine: s.quarantine, tracing: o.Tracing}
	var h handler
	var keys *sources.PushGuard
	var rejects *rejections
	var err error
	switch spec := src.Spec.(type) {
	case *sources.WebhookSpec:
		var wh *webhook
		if wh, err = newWebhook(env, spec); err == nil {
			h, rejects = wh, wh.rejects
		}
		keys = &spec.PushGuard
	case *sources.WSIngressSpec:
		h, err = newWSIngress(env, spec)
		keys = &spec.PushGuard
	default:
		return nil
	}
	if err == nil {
		r.handlers[src.Name] = h
		err = addGuard(r, env, o.Push, keys, rejects, limiters)
	}
	if err != nil {
		return fmt.Errorf("source %q: %w", src.Name, err)
	}
	return nil
}

// addGuard builds the guard of a push source from its keys, if it has
// any, into r; rejects records its refusals (nil: a source that keeps none).
func addGuard(r *routes, env handlerEnv, p config.Push, keys *sources.PushGuard, rejects *rejections, limiters *sources.RateLimiters) error {
	if keys.RequireClientCert && p.ClientCAFile == "" {
		return errors.New("require_client_cert needs push.client_ca_file")
	}
	g, err := newGuard(env, keys, limiters)
	if err != nil || g == nil {
		return err
	}
	g.rejects = rejects
	r.guards[env.source.Name] = g
	return nil
}

// serverTLS is the TLS configuration of the push listener: its certificate
// and, with client_ca_file, the verification of the client certificates
// given (a source's require_client_cert refuses requests without one).
func serverTLS(p config.Push) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(p.TLSCertFile, p.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("push.tls_cert_file: %w", err)
	}
	conf := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	if p.ClientCAFile != "" {
		if conf.ClientCAs, err = config.LoadClientCAs(p.ClientCAFile); err != nil {
			return nil, fmt.Errorf("push.client_ca_file: %w", err)
		}
		conf.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return conf, nil
}

// Addr returns the address the listener is bound to.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// dispatch routes a request to its source's handler, once its source's
// guard (guard.go) admits it.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	rt := s.routes.Load()
	h, ok := rt.handlers[name]
	if !ok {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("no push source %q is enabled", name))
		return
	}
	if s.onRequest != nil {
		s.onRequest(name)
	}
	if g := rt.guards[name]; g != nil && !g.admit(w, r) {
		return
	}
	h.ServeHTTP(w, r)
}

// Apply changes the served push sources to those of srcs, as plan says
// (see config.Plan): the handlers of sources it starts or restarts are
// built first, and if one cannot be, nothing changes. Then the new routes
// take the requests that arrive from now on, while those in progress end
// on the handler that took them; the handlers of stopped and restarted
// sources then close (a WebSocket source closes its connections, whose
// devices reconnect and send again what was not acknowledged), and the
// series of stopped sources are deleted.
func (s *Server) Apply(plan config.Plan, srcs []config.Source, limiters *sources.RateLimiters) error {
	old := s.routes.Load()
	next := &routes{handlers: make(map[string]handler), guards: make(map[string]*guard)}
	built := &routes{handlers: make(map[string]handler), guards: make(map[string]*guard)}
	for _, src := range srcs {
		if !slices.Contains(plan.Start, src.Name) && !slices.Contains(plan.Restart, src.Name) {
			continue
		}
		if err := s.addRoute(built, src, limiters); err != nil {
			built.close()
			return err
		}
	}
	for _, name := range plan.Stay {
		if h, ok := old.handlers[name]; ok {
			next.handlers[name], next.guards[name] = h, old.guards[name]
			if next.guards[name] == nil {
				delete(next.guards, name)
			}
		}
	}
	maps.Copy(next.handlers, built.handlers)
	maps.Copy(next.guards, built.guards)
	s.routes.Store(next)
	for _, name := range slices.Concat(plan.Stop, plan.Restart) {
		h, ok := old.handlers[name]
		if !ok {
			continue
		}
		h.Close()
		if wh, ok := h.(*webhook); ok {
			// Secrets removed from the list leave no series behind.
			keep := 0
			if nh, ok := next.handlers[name].(*webhook); ok {
				keep = len(nh.matches)
			}
			for i := keep; i < len(wh.matches); i++ {
				s.o.Metrics.signatureMatches.DeleteLabelValues(name, strconv.Itoa(i))
			}
		}
	}
	for _, name := range plan.Stop {
		s.o.Metrics.forget(name)
	}
	return nil
}

// Shutdown stops taking requests, waits for those in progress (each ends
// once its commit is answered) until ctx ends, closes the connections
// that sent no request (internal/httpstop: net/http would wait 5 s for
// them), then lets every handler close its own connections.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.closing.Swap(true) {
		return nil
	}
	err := httpstop.Shutdown(ctx, s.srv, s.conns)
	if err != nil {
		err = fmt.Errorf("push listener shutdown: %w", err)
	}
	<-s.done
	s.closeHandlers()
	return err
}

// closeHandlers closes every handler, then the quarantine, which writes
// what it holds.
func (s *Server) closeHandlers() {
	s.routes.Load().close()
	s.closeQuarantine()
}

func (s *Server) closeQuarantine() {
	if s.quarantine != nil {
		s.quarantine.close()
	}
}

// close closes every handler of r.
func (r *routes) close() {
	for _, h := range r.handlers {
		h.Close()
	}
}

// errorBody is the JSON body of an error answer.
type errorBody struct {
	Error string `json:"error"`
}

// WriteJSON answers code with v as JSON.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		code, body = http.StatusInternalServerError, []byte(`{"error":"encode the answer"}`)
	}
	writeJSONBytes(w, code, body)
}

// writeJSONBytes answers code with body, a JSON value, and a newline.
func writeJSONBytes(w http.ResponseWriter, code int, body []byte) {
	h := w.Header() // the keys are canonical already
	h["Content-Type"] = []string{"application/json"}
	h["X-Content-Type-Options"] = []string{"nosniff"}
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}

// WriteError answers code with {"error": msg}.
func WriteError(w http.ResponseWriter, code int, msg string) {
	WriteJSON(w, code, errorBody{Error: msg})
}
