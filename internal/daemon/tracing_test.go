package daemon

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	otelattr "go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingestorhq/ingestor/internal/telemetry/otlptest"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
	"github.com/ingestorhq/ingestor/processor"
)

// TestWebhookTraceReachesTheProcessor: a webhook request bringing a W3C
// traceparent is continued by the daemon, and the trace an OTLP receiver
// gets holds, in that one trace, the request's server span (a child of
// the caller's), the raw write, the commit, the frame's send and ack, and
// the processor's handler span, whose context the handler sees. A refused
// request's log line carries its trace id, and X-Request-ID is echoed.
func TestWebhookTraceReachesTheProcessor(t *testing.T) {
	recv := otlptest.Start(t)
	h := startDaemon(t, "", "", tracedWebhookTOML(recv.Endpoint()))
	tp := processorTracing(t, recv)
	var mu sync.Mutex
	var seen []trace.SpanContext
	h.startProcessorWith(processor.Options{TracerProvider: tp}, func(ctx context.Context, ev *processor.Event) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, trace.SpanContextFromContext(ctx))
		return nil
	})

	const traceID, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	resp := postWebhook(t, h, "application/json", "00-"+traceID+"-"+callerSpan+"-01", "req-42")
	if resp.StatusCode != http.StatusAccepted || resp.Header.Get("X-Request-ID") != "req-42" {
		t.Fatalf("answered %d with X-Request-ID %q, want 202 and req-42", resp.StatusCode, resp.Header.Get("X-Request-ID"))
	}
	want := []string{"POST /ingest/{name}", "raw write", "commit", "send", "ack", "process"}
	testsync.WaitFor(t, "the trace's spans at the receiver", 30*time.Second, func() bool {
		if err := tp.ForceFlush(t.Context()); err != nil {
			t.Logf("processor flush: %v", err)
		}
		names := map[string]bool{}
		for _, s := range recv.Trace(traceID) {
			names[s.Name] = true
		}
		for _, n := range want {
			if !names[n] {
				return false
			}
		}
		return true
	})
	spans := recv.Trace(traceID)
	byName := map[string]otlptest.Span{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	server := byName["POST /ingest/{name}"]
	if server.ParentSpanID != callerSpan || server.Service != "ingestor" {
		t.Errorf("server span %+v: want the caller's span %s as parent, service ingestor", server, callerSpan)
	}
	for _, n := range []string{"raw write", "commit"} {
		if byName[n].ParentSpanID != server.SpanID || byName[n].Attrs["ingestor.source"] != "hooks" {
			t.Errorf("%s span %+v: want a child of the request's span %s, source hooks", n, byName[n], server.SpanID)
		}
	}
	if byName["ack"].ParentSpanID != byName["send"].SpanID {
		t.Errorf("ack span's parent %s, want the send span %s", byName["ack"].ParentSpanID, byName["send"].SpanID)
	}
	process := byName["process"]
	if process.Service != "test-processor" || process.Attrs["ingestor.source"] != "hooks" {
		t.Errorf("process span %+v: want the processor's, of source hooks", process)
	}
	mu.Lock()
	if len(seen) != 1 || seen[0].TraceID().String() != traceID || seen[0].SpanID().String() != process.SpanID {
		t.Errorf("the handler's span contexts %v, want one in trace %s with the process span %s", seen, traceID, process.SpanID)
	}
	mu.Unlock()

	// A refused request is logged with its trace id.
	const refusedTrace = "5bf92f3577b34da6a3ce929d0e0e4737"
	if resp := postWebhook(t, h, "text/plain", "00-"+refusedTrace+"-"+callerSpan+"-01", ""); resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("text/plain answered %d, want 415", resp.StatusCode)
	}
	testsync.WaitFor(t, "the refusal's log line with its trace id", 10*time.Second, func() bool {
		for _, line := range strings.Split(h.logs.String(), "\n") {
			if strings.Contains(line, "webhook request refused") && strings.Contains(line, "trace_id="+refusedTrace) {
				return true
			}
		}
		return false
	})
}

// TestUntracedWebhookCarriesNoTraceContext: with tracing off, a webhook's
// traceparent is not continued and its event reaches the processor with
// no trace context (and nothing is exported anywhere). The publish latency
// histogram counts the frame's first send, and the connected-processors
// gauge shows the processor.
func TestUntracedWebhookCarriesNoTraceContext(t *testing.T) {
	h := startDaemon(t, "", "", `
[push]
addr = "127.0.0.1:0"

[source.hooks]
kind = "webhook"
`)
	got := make(chan *processor.Event, 1)
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		got <- ev
		return nil
	})
	if resp := postWebhook(t, h, "application/json", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("answered %d, want 202", resp.StatusCode)
	}
	select {
	case ev := <-got:
		if ev.Traceparent != "" || ev.Tracestate != "" {
			t.Errorf("event carries trace context %q %q with tracing off", ev.Traceparent, ev.Tracestate)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no event reached the processor")
	}
	// The frame's first send was timed from its commit, and the processor
	// shows as connected.
	if n := metric(t, h.d.Registry(), "ingestor_publish_latency_seconds"); n != 1 {
		t.Errorf("ingestor_publish_latency_seconds counts %v sends, want 1", n)
	}
	testsync.WaitFor(t, "the processor counted as connected", 10*time.Second, func() bool {
		return metric(t, h.d.Registry(), "ingestor_processors_connected") == 1
	})
}

// processorTracing is a processor's tracer provider exporting to recv.
func processorTracing(t *testing.T, recv *otlptest.Receiver) *sdktrace.TracerProvider {
	t.Helper()
	exp, err := otlptracegrpc.New(t.Context(), otlptracegrpc.WithEndpointURL(recv.Endpoint()))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(testResource("test-processor")))
	t.Cleanup(func() {
		if err := tp.Shutdown(context.Background()); err != nil {
			t.Logf("processor tracing shutdown: %v", err)
		}
	})
	return tp
}

// postWebhook posts one event to h's webhook source hooks with the given
// Content-Type, traceparent and X-Request-ID ("" sends none).
func postWebhook(t *testing.T, h *harness, contentType, traceparent, requestID string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+h.d.PushAddr()+"/ingest/hooks",
		strings.NewReader(`{"id":"evt-1","n":1}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("traceparent", traceparent)
	if requestID != "" {
		req.Header.Set("X-Request-ID", requestID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Fatal(err)
	}
	return resp
}

func testResource(service string) *resource.Resource {
	return resource.NewSchemaless(otelattr.String("service.name", service))
}

// TestPollTraceReachesTheProcessor: with tracing on, a poll is the root of
// a trace holding its HTTP GET (a child, with the client conventions), the
// raw write, the commit and the frame's send and ack; the events reach the
// processor with that trace's traceparent, and the poll's debug log line
// carries its trace_id.
func TestPollTraceReachesTheProcessor(t *testing.T) {
	recv := otlptest.Start(t)
	feed := testupstream.New(t, 5, 100)
	h := startDaemon(t, "", "", fmt.Sprintf("[telemetry]\nendpoint = %q\n", recv.Endpoint())+httpSource("api", feed.URL))
	got := make(chan *processor.Event, 5)
	h.startProcessor(func(_ context.Context, ev *processor.Event) error {
		got <- ev
		return nil
	})
	var ev *processor.Event
	select {
	case ev = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("no event reached the processor")
	}
	if len(ev.Traceparent) != 55 {
		t.Fatalf("event traceparent %q, want a W3C traceparent", ev.Traceparent)
	}
	traceID := ev.Traceparent[3:35]
	want := []string{"poll", "HTTP GET", "raw write", "commit", "send", "ack"}
	var byName map[string]otlptest.Span
	defer func() {
		if t.Failed() {
			t.Logf("spans of the trace: %+v", recv.Trace(traceID))
		}
	}()
	testsync.WaitFor(t, "the poll's trace at the receiver", 30*time.Second, func() bool {
		byName = map[string]otlptest.Span{}
		for _, s := range recv.Trace(traceID) {
			byName[s.Name] = s
		}
		for _, n := range want {
			if _, ok := byName[n]; !ok {
				return false
			}
		}
		return true
	})
	poll := byName["poll"]
	if poll.ParentSpanID != "" || poll.Attrs["ingestor.source"] != "api" {
		t.Errorf("poll span %+v: want a root span of source api", poll)
	}
	for _, n := range []string{"HTTP GET", "raw write", "commit"} {
		if byName[n].ParentSpanID != poll.SpanID {
			t.Errorf("%s span's parent %s, want the poll %s", n, byName[n].ParentSpanID, poll.SpanID)
		}
	}
	if ev.Traceparent[36:52] != poll.SpanID {
		t.Errorf("event traceparent %s, want the poll span %s", ev.Traceparent, poll.SpanID)
	}
	if byName["HTTP GET"].Attrs["http.response.status_code"] == "" {
		t.Errorf("HTTP GET span has no http.response.status_code: %+v", byName["HTTP GET"].Attrs)
	}
	// The poll's log line carries its trace.
	if !strings.Contains(h.logs.String(), "msg=polled") || !strings.Contains(h.logs.String(), "trace_id="+traceID) {
		t.Errorf("no polled log line with trace_id=%s", traceID)
	}
}

// TestPushTraceSurvivesARestart: a traced webhook event queued while no
// processor runs still carries its request's trace context when a
// restarted daemon delivers it (stored with the event, event_traces).
func TestPushTraceSurvivesARestart(t *testing.T) {
	recv := otlptest.Start(t)
	dir := t.TempDir()
	sources := tracedWebhookTOML(recv.Endpoint())
	h := startDaemonIn(t, dir, "", "", "", sources, Options{})
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	if resp := postWebhook(t, h, "application/json", "00-"+traceID+"-00f067aa0ba902b7-01", ""); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("answered %d, want 202", resp.StatusCode)
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	h2 := startDaemonIn(t, dir, "", "", "", sources, Options{})
	got := make(chan *processor.Event, 1)
	h2.startProcessor(func(_ context.Context, ev *processor.Event) error {
		got <- ev
		return nil
	})
	select {
	case ev := <-got:
		if len(ev.Traceparent) != 55 || ev.Traceparent[3:35] != traceID {
			t.Errorf("event after the restart carries traceparent %q, want one of trace %s", ev.Traceparent, traceID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no event reached the processor after the restart")
	}
}

// tracedWebhookTOML is a daemon's push listener and webhook source hooks,
// traced to the OTLP receiver at endpoint.
func tracedWebhookTOML(endpoint string) string {
	return fmt.Sprintf(`
[push]
addr = "127.0.0.1:0"

[telemetry]
endpoint = %q

[source.hooks]
kind = "webhook"
`, endpoint)
}
