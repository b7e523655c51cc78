package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/backoff"
	"github.com/ingestorhq/ingestor/internal/devicewire"
	"github.com/ingestorhq/ingestor/internal/edge/edgeconfig"
	"github.com/ingestorhq/ingestor/internal/telemetry"
	"github.com/ingestorhq/ingestor/internal/unixsock"
)

// DefaultWriteTimeout bounds the handshake and the write of one envelope.
const DefaultWriteTimeout = 10 * time.Second

// Options configure a forwarder: the settings of its [edge] table
// (edgeconfig.Config, whose zero fields mean their defaults here), and
// what only a program gives. URL, Token and DeviceID are required.
type Options struct {
	edgeconfig.Config
	// StdinReader is what the stdin input reads when Stdin is set;
	// default os.Stdin.
	StdinReader io.Reader
	// Logger receives the forwarder's log; default slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the metrics instead of a registry of the
	// forwarder's own; MetricsAddr then serves it if it is also a
	// prometheus.Gatherer (such as a *prometheus.Registry).
	Registerer prometheus.Registerer
	// TracerProvider, when set, traces each input request or batch
	// (continuing an HTTP request's traceparent header), puts its trace
	// context in the envelopes that have none, and traces each envelope's
	// send to the daemon until its answer; nil traces nothing.
	TracerProvider trace.TracerProvider
}

// withDefaults returns o with every zero field set to its default.
func (o Options) withDefaults() Options {
	o.Config = o.Config.WithDefaults()
	if o.Stdin && o.StdinReader == nil {
		o.StdinReader = os.Stdin
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate returns every problem with o (after its defaults), joined.
func (o Options) Validate() error {
	var errs []error
	for _, fe := range o.Config.WithDefaults().Validate(nil) {
		errs = append(errs, fe)
	}
	return errors.Join(errs...)
}

// Forwarder is a running edge forwarder: started by Start, stopped by
// cancelling its context, then waited for with Wait.
type Forwarder struct {
	opts  Options
	log   *slog.Logger
	ob    *outbox
	enc   *devicewire.Encoder
	m     *metrics
	retry backoff.Policy

	httpLn, metricsLn, sockLn net.Listener
	servers                   []served

	wg   sync.WaitGroup
	done chan struct{}
	err  error
}

// served is an HTTP server and its listener.
type served struct {
	srv *http.Server
	ln  net.Listener
}

// Run starts a forwarder and returns once ctx ends and it has stopped.
func Run(ctx context.Context, o Options) error {
	f, err := Start(ctx, o)
	if err != nil {
		return err
	}
	return f.Wait()
}

// Start validates o, opens the outbox, starts the inputs and the sender,
// and returns. Every event accepted from then on is committed to the
// outbox before its producer hears OK. Cancelling ctx stops the
// forwarder: inputs close, the connection closes, the outbox is closed
// with every unacknowledged envelope still in it.
func Start(ctx context.Context, o Options) (*Forwarder, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	client, err := httpClient(o.CAFile)
	if err != nil {
		return nil, err
	}
	ob, err := openOutbox(ctx, o.Outbox, o.MaxOutboxBytes, o.Logger)
	if err != nil {
		return nil, err
	}
	f := &Forwarder{opts: o, log: o.Logger, ob: ob, done: make(chan struct{}),
		retry: backoff.Policy{Base: o.ReconnectBase, Max: o.ReconnectMax},
		enc:   &devicewire.Encoder{DeviceID: o.DeviceID, SessionID: devicewire.NewID(), MaxBytes: o.MaxEnvelopeBytes, Now: time.Now}}
	reg, gather := o.Registerer, prometheus.Gatherer(nil)
	if g, ok := reg.(prometheus.Gatherer); ok {
		gather = g
	}
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, gather = r, r
	}
	if f.m, err = newMetrics(reg, ob); err != nil {
		return nil, errors.Join(fmt.Errorf("register metrics: %w", err), ob.close())
	}
	if err := f.listen(gather); err != nil {
		return nil, errors.Join(err, f.closeListeners(true), ob.close())
	}
	s := &sender{url: o.URL, header: http.Header{"Authorization": {"Bearer " + o.Token}}, client: client,
		window: o.Window, ackTimeout: o.AckTimeout, writeTimeout: DefaultWriteTimeout, reconnect: f.retry,
		ob: ob, log: o.Logger, m: f.m}
	if o.TracerProvider != nil {
		s.tracer = o.TracerProvider.Tracer(telemetry.ScopeName)
	}
	events, bytes := ob.backlog()
	f.log.Info("edge forwarder started", "outbox", o.Outbox, "pending_events", events, "pending_bytes", bytes,
		"url", o.URL, "device_id", o.DeviceID, "session_id", f.enc.SessionID)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		s.run(ctx)
	}()
	f.serve(ctx)
	go f.stop(ctx)
	return f, nil
}

// httpClient returns the client the sender dials with: the default one,
// or one trusting the CAs in caFile.
func httpClient(caFile string) (*http.Client, error) {
	if caFile == "" {
		return http.DefaultClient, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("ca_file %s: no PEM certificate in it", caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr}, nil
}

// listen opens the listeners of the HTTP input, the Unix socket and the
// metrics endpoint, so that Start fails when one cannot be had.
func (f *Forwarder) listen(gather prometheus.Gatherer) error {
	var err error
	if f.opts.HTTPAddr != "" {
		if f.httpLn, err = net.Listen("tcp", f.opts.HTTPAddr); err != nil {
			return fmt.Errorf("http input: %w", err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/events", f.handleEvents)
		var h http.Handler = mux
		if tp := f.opts.TracerProvider; tp != nil {
			h = otelhttp.NewHandler(mux, "edge", otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{}),
				otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method + " /events" }))
		}
		f.servers = append(f.servers, served{f.server(f.httpLn, h), f.httpLn})
	}
	if f.opts.MetricsAddr != "" {
		if gather == nil {
			return errors.New("metrics: the Registerer given is not a Gatherer, so serve its metrics where it is gathered")
		}
		if f.metricsLn, err = net.Listen("tcp", f.opts.MetricsAddr); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(gather, promhttp.HandlerOpts{}))
		f.servers = append(f.servers, served{f.server(f.metricsLn, mux), f.metricsLn})
	}
	if f.opts.Socket != "" {
		if f.sockLn, err = unixsock.Listen(f.opts.Socket); err != nil {
			return fmt.Errorf("socket input: %w", err)
		}
	}
	return nil
}

// server returns an HTTP server for ln with limits against slow clients.
func (f *Forwarder) server(ln net.Listener, h http.Handler) *http.Server {
	return &http.Server{Addr: ln.Addr().String(), Handler: h, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: time.Minute, WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(f.log.Handler(), slog.LevelWarn)}
}

// serve starts the goroutines of the inputs.
func (f *Forwarder) serve(ctx context.Context) {
	for _, s := range f.servers {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				f.log.Error("http server", "addr", s.srv.Addr, "err", err)
			}
		}()
	}
	if f.sockLn != nil {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.acceptSocket(ctx)
		}()
	}
	if f.opts.Stdin {
		// Not in wg: a read of stdin cannot be interrupted, so a stop
		// does not wait for it. The outbox refuses its commits once closed.
		go func() {
			if err := f.readStdin(ctx, f.opts.StdinReader); err != nil {
				f.log.Error("stdin input stopped", "err", err)
			}
		}()
	}
}

// acceptSocket serves each connection to the Unix socket until the
// listener closes.
func (f *Forwarder) acceptSocket(ctx context.Context) {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := f.sockLn.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				f.log.Error("socket input: accept", "err", err)
			}
			return
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			stop := context.AfterFunc(ctx, func() {
				if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
					f.log.Debug("socket input: close", "err", err)
				}
			})
			defer stop()
			if err := f.serveSocket(ctx, c); err != nil && ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				f.log.Warn("socket input: connection", "err", err)
			}
		}()
	}
}

// HTTPAddr returns the address the HTTP input listens on ("" when off).
func (f *Forwarder) HTTPAddr() string {
	if f.httpLn == nil {
		return ""
	}
	return f.httpLn.Addr().String()
}

// MetricsAddr returns the address of the metrics endpoint ("" when off).
func (f *Forwarder) MetricsAddr() string {
	if f.metricsLn == nil {
		return ""
	}
	return f.metricsLn.Addr().String()
}

// stop waits for ctx to end, then stops the inputs, waits for the sender
// and the inputs, and closes the outbox.
func (f *Forwarder) stop(ctx context.Context) {
	<-ctx.Done()
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	for _, s := range f.servers {
		errs = append(errs, s.srv.Shutdown(shut))
	}
	errs = append(errs, f.closeListeners(false))
	f.wg.Wait()
	errs = append(errs, f.ob.close())
	f.err = errors.Join(errs...)
	f.log.Info("edge forwarder stopped", "err", f.err)
	close(f.done)
}

// closeListeners closes the Unix socket listener, which removes its file,
// and with all the HTTP listeners too (which Shutdown closes otherwise).
func (f *Forwarder) closeListeners(all bool) error {
	lns := []net.Listener{f.sockLn}
	if all {
		lns = append(lns, f.httpLn, f.metricsLn)
	}
	var errs []error
	for _, ln := range lns {
		if ln == nil {
			continue
		}
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Wait returns once the forwarder has stopped, with any error stopping it.
func (f *Forwarder) Wait() error {
	<-f.done
	return f.err
}
