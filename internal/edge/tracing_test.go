package edge

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	otelattr "go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ingestorhq/ingestor/internal/devicewire"
	"github.com/ingestorhq/ingestor/internal/telemetry/otlptest"
	"github.com/ingestorhq/ingestor/internal/testsync"
)

// TestForwarderTracesEnvelopes: with tracing on, a POST /events bringing a
// traceparent is continued: the forwarder's server span is its child, the
// envelope sent to the daemon carries the server span's traceparent (so
// the daemon continues the trace), and an "edge send" span from the send
// to the daemon's answer is in the same trace. An event with its own
// traceparent keeps it.
func TestForwarderTracesEnvelopes(t *testing.T) {
	recv := otlptest.Start(t)
	exp, err := otlptracegrpc.New(t.Context(), otlptracegrpc.WithEndpointURL(recv.Endpoint()))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(otelattr.String("service.name", "edge"))))
	t.Cleanup(func() {
		if err := tp.Shutdown(context.Background()); err != nil {
			t.Logf("tracing shutdown: %v", err)
		}
	})
	d := newFakeDaemon(t)
	o := testOptions(t, d)
	o.TracerProvider = tp
	f := startForwarder(t, o)

	const traceID, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	const ownParent = "00-5bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b8-01"
	req, err := http.NewRequest(http.MethodPost, "http://"+f.HTTPAddr()+"/events",
		strings.NewReader(`{"event_id":"e1","type":"t","payload":1}`+"\n"+`{"event_id":"e2","type":"t","payload":2,"traceparent":"`+ownParent+`"}`+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("traceparent", "00-"+traceID+"-"+callerSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST answered %d (%v), want 200", resp.StatusCode, err)
	}
	testsync.WaitFor(t, "both events stored and their send spans ended", 20*time.Second, func() bool {
		sends := 0
		for _, s := range recv.Spans() {
			if s.Name == "edge send" {
				sends++
			}
		}
		return d.storedCount() == 2 && sends == 2
	})
	var server otlptest.Span
	for _, s := range recv.Trace(traceID) {
		if s.Name == "POST /events" {
			server = s
		}
	}
	if server.ParentSpanID != callerSpan {
		t.Fatalf("no server span under the caller's span %s in trace %s: %+v", callerSpan, traceID, recv.Spans())
	}
	e1, err := devicewire.DecodeEnvelope(d.receivedOf("e1")[0].raw)
	if err != nil || e1.Traceparent != "00-"+traceID+"-"+server.SpanID+"-01" {
		t.Errorf("envelope e1 carries traceparent %q (%v), want the server span's", e1.Traceparent, err)
	}
	e2, err := devicewire.DecodeEnvelope(d.receivedOf("e2")[0].raw)
	if err != nil || e2.Traceparent != ownParent {
		t.Errorf("envelope e2 carries traceparent %q (%v), want its own %q", e2.Traceparent, err, ownParent)
	}
	found := false
	for _, s := range recv.Trace(traceID) {
		if s.Name == "edge send" && s.ParentSpanID == server.SpanID && s.Attrs["ingestor.event_id"] == "e1" && s.Attrs["ingestor.answer"] == "stored" {
			found = true
		}
	}
	if !found {
		t.Errorf("no edge send span of e1 answered stored under the server span: %+v", recv.Trace(traceID))
	}
}
