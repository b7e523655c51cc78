package push

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingestorhq/ingestor/config"
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
}

// Server is the push listener: /ingest/NAME and below, for each enabled
// push source.
type Server struct {
	srv      *http.Server
	ln       net.Listener
	handlers map[string]handler
	// guards holds the guard of each source that has one.
	guards map[string]*guard
	// quarantine keeps the refused deliveries of webhook sources
	// (quarantine.go); nil without an inbox.
	quarantine *quarantine
	log        *slog.Logger
	closing    atomic.Bool
	done       chan struct{}
	onRequest  func(source string)
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
	s := &Server{handlers: make(map[string]handler), guards: make(map[string]*guard), log: o.Logger, done: make(chan struct{}), onRequest: o.OnRequest}
	if o.Inbox != nil {
		s.quarantine = newQuarantine(o.Inbox.o.Queue, o.Metrics, o.Logger)
	}
	for _, src := range o.Sources {
		if !src.Enabled {
			continue
		}
		env := handlerEnv{source: src, inbox: o.Inbox, log: o.Logger.With("source", src.Name), metrics: o.Metrics, reg: o.Registry,
			loopback: config.LoopbackAddr(o.Push.Addr), quarantine: s.quarantine}
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
			continue
		}
		if err == nil {
			s.handlers[src.Name] = h
			err = s.addGuard(env, o, keys, rejects)
		}
		if err != nil {
			s.closeHandlers()
			return nil, fmt.Errorf("source %q: %w", src.Name, err)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/ingest/{name}", s.dispatch)
	mux.HandleFunc("/ingest/{name}/{rest...}", s.dispatch)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		WriteError(w, http.StatusNotFound, "not found: push sources are served under /ingest/NAME")
	})
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idleTimeout,
		MaxHeaderBytes: maxHeaderBytes, ErrorLog: slog.NewLogLogger(o.Logger.Handler(), slog.LevelDebug)}
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

// addGuard builds the guard of a push source from its keys, if it has
// any; rejects records its refusals (nil: a source that keeps none).
func (s *Server) addGuard(env handlerEnv, o ServerOptions, keys *sources.PushGuard, rejects *rejections) error {
	if keys.RequireClientCert && o.Push.ClientCAFile == "" {
		return errors.New("require_client_cert needs push.client_ca_file")
	}
	g, err := newGuard(env, keys, o.Limiters)
	if err != nil || g == nil {
		return err
	}
	g.rejects = rejects
	s.guards[env.source.Name] = g
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
	h, ok := s.handlers[name]
	if !ok {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("no push source %q is enabled", name))
		return
	}
	if s.onRequest != nil {
		s.onRequest(name)
	}
	if g := s.guards[name]; g != nil && !g.admit(w, r) {
		return
	}
	h.ServeHTTP(w, r)
}

// Shutdown stops taking requests, waits for those in progress (each ends
// once its commit is answered) until ctx ends, then lets every handler
// close its own connections.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.closing.Swap(true) {
		return nil
	}
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(fmt.Errorf("push listener shutdown: %w", err), s.srv.Close())
	}
	<-s.done
	s.closeHandlers()
	return err
}

// closeHandlers closes every handler, then the quarantine, which writes
// what it holds.
func (s *Server) closeHandlers() {
	for _, h := range s.handlers {
		h.Close()
	}
	if s.quarantine != nil {
		s.quarantine.close()
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
