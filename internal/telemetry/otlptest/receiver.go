// Package otlptest runs an OTLP trace receiver for tests: the collector's
// gRPC TraceService (go.opentelemetry.io/proto/otlp) on a loopback port,
// keeping every span it is sent.
package otlptest

import (
	"context"
	"encoding/hex"
	"net"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// Span is one span received, its ids in lowercase hex.
type Span struct {
	Name, TraceID, SpanID, ParentSpanID string
	// Service is the resource's service.name.
	Service string
	// Attrs are the span's attributes, as strings.
	Attrs map[string]string
	// Error reports a span whose status is an error.
	Error bool
}

// Receiver is a running OTLP/gRPC trace receiver.
type Receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	addr string

	mu    sync.Mutex
	spans []Span
}

// Start starts a receiver on a free loopback port, stopped when t ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r, stop, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return r
}

// Listen starts a receiver on a free loopback port; stop stops it.
func Listen() (r *Receiver, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	r = &Receiver{addr: ln.Addr().String()}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, r)
	go func() { _ = srv.Serve(ln) }() // returns when Stop closes the listener
	return r, srv.Stop, nil
}

// Count returns how many spans were received.
func (r *Receiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.spans)
}

// Endpoint is the receiver's URL for [telemetry] endpoint (plaintext).
func (r *Receiver) Endpoint() string { return "http://" + r.addr }

// Export implements the OTLP TraceService.
func (r *Receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()), Service: service, Attrs: map[string]string{},
					Error: s.GetStatus().GetCode() == 2}
				for _, a := range s.GetAttributes() {
					v := a.GetValue()
					switch {
					case v.GetStringValue() != "":
						sp.Attrs[a.GetKey()] = v.GetStringValue()
					default:
						sp.Attrs[a.GetKey()] = v.String()
					}
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Trace returns the spans received so far of the trace traceID.
func (r *Receiver) Trace(traceID string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}
