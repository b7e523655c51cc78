package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/adminapi"
	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// tapFeedTOML is an http_poll source NAME polling url.
func tapFeedTOML(name, url string) string {
	return fmt.Sprintf(`
[source.%s]
kind = "http_poll"
poll_url = %q
interval = "20ms"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
time_field = "ts"
`, name, url+"/feed")
}

// tapRun is one `ingestor tap` running in the background.
type tapRun struct {
	code     chan int
	out, err bytes.Buffer
}

func startTap(args ...string) *tapRun {
	r := &tapRun{code: make(chan int, 1)}
	go func() { r.code <- run(append([]string{"tap"}, args...), &r.out, &r.err) }()
	return r
}

// wait returns the command's exit code, failing t if it runs on.
func (r *tapRun) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-r.code:
		return code
	case <-time.After(time.Minute):
		t.Fatal("ingestor tap did not exit")
		return 0
	}
}

// TestTapCommand runs `ingestor tap` against a daemon whose admin
// endpoints need a token (the command sends the config's): one tap of
// source api in text, cut at 12 bytes, and one of every source as JSON
// lines, each until its -limit; an unknown source is refused with the
// configured ones named.
func TestTapCommand(t *testing.T) {
	dir := t.TempDir()
	api, other := testupstream.NewHeld(t, 20, 10), testupstream.NewHeld(t, 10, 10)
	cfgPath, cfg := writeDaemonConfig(t, dir, `admin_token = "tap-test-token-0123456789abcdef"`, "",
		tapFeedTOML("api", api.URL)+tapFeedTOML("other", other.URL))
	d, _ := startInProcess(t, cfg)

	var out, errb bytes.Buffer
	if code := run([]string{"tap", "-c", cfgPath, "-source", "api,nope"}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), `ingestor tap: daemon: unknown source "nope": the configured sources are api, other`) {
		t.Errorf("tap -source api,nope: exit %d, stderr %q", code, errb.String())
	}

	text := startTap("-c", cfgPath, "-source", "api", "-max-bytes", "12", "-limit", "20")
	jsonl := startTap("-c", cfgPath, "-format", "json", "-limit", "30")
	testsync.WaitFor(t, "two tap sessions", 30*time.Second, func() bool {
		return scrapeMetric(d.HTTPAddr(), "ingestor_tap_sessions") == 2
	})
	other.Release()
	api.Release()

	if code := text.wait(t); code != 0 {
		t.Fatalf("tap -source api: exit %d: %s", code, text.err.String())
	}
	if !strings.Contains(text.err.String(), "tapping api at http://") {
		t.Errorf("tap's stderr %q lacks what it taps", text.err.String())
	}
	lines := strings.Split(strings.TrimSuffix(text.out.String(), "\n"), "\n")
	if len(lines) != 20 {
		t.Fatalf("tap -source api -limit 20 printed %d lines:\n%s", len(lines), text.out.String())
	}
	for i, l := range lines {
		n := i + 1
		rec := testupstream.Record(n)
		want := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z api seq=\d+ key=` + testupstream.ID(n) + " " +
			regexp.QuoteMeta(string(rec[:12])) + regexp.QuoteMeta(fmt.Sprintf("… (truncated: 12 of %d bytes)", len(rec))) + "$")
		if !want.MatchString(l) {
			t.Errorf("line %d: %q, want it to match %s", n, l, want)
		}
	}

	if code := jsonl.wait(t); code != 0 {
		t.Fatalf("tap -format json: exit %d: %s", code, jsonl.err.String())
	}
	bySource := map[string]int{}
	sc := bufio.NewScanner(&jsonl.out)
	for sc.Scan() {
		var ev adminapi.TapEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Type != adminapi.TapTypeEvent || ev.Payload == nil {
			t.Fatalf("tap -format json line %q: %v", sc.Text(), err)
		}
		if !strings.HasPrefix(*ev.Payload, `{"id":"`+ev.Key+`"`) || ev.Truncated {
			t.Errorf("json event %s: payload %q, want the whole record", ev.Key, *ev.Payload)
		}
		bySource[ev.Source]++
	}
	if bySource["api"] != 20 || bySource["other"] != 10 {
		t.Errorf("tap -format json: events by source %v, want api 20 and other 10", bySource)
	}
}

// TestTapPrinter prints a stream as the daemon sends it: in text, a
// payload's control characters are escaped (a payload cannot drive the
// terminal), a cut one is marked with its full size, bytes that are not
// UTF-8 show as base64, and a "dropped" line says how many events the
// terminal was too slow for; as JSON, the lines are passed on as they
// came. The daemon's "end" line ends the tap with its reason.
func TestTapPrinter(t *testing.T) {
	stream := `{"type":"start","sources":["api"],"max_bytes":8,"buffer_events":1000,"buffer_bytes":1048576}

{"type":"event","source":"api","key":"k\u001b1","seq":7,"committed_at":"2026-11-24T23:15:05.019Z","fetched_at":"2026-11-24T23:15:05Z","size":40,"truncated":true,"payload":"a\nb\u001b[31m"}
{"type":"dropped","dropped":1234}
{"type":"event","source":"api","key":"k2","seq":1242,"committed_at":"2026-11-24T23:15:06Z","fetched_at":"2026-11-24T23:15:06Z","size":2,"truncated":false,"payload_b64":"/w=="}
{"type":"dropped","dropped":1}
{"type":"end","reason":"the daemon is stopping"}
`
	for _, json := range []bool{false, true} {
		var out, errb bytes.Buffer
		p := &tapPrinter{o: tapOptions{json: json}, out: bufio.NewWriter(&out), stderr: &errb, where: "http://127.0.0.1:9464/tap"}
		err := p.follow(bufio.NewReader(strings.NewReader(stream)))
		if ferr := p.out.Flush(); ferr != nil {
			t.Fatal(ferr)
		}
		if err == nil || err.Error() != "the daemon ended the stream: the daemon is stopping" {
			t.Errorf("json %v: follow ended with %v", json, err)
		}
		if errb.String() != "tapping api at http://127.0.0.1:9464/tap, payloads cut at 8 bytes; Ctrl-C stops\n" {
			t.Errorf("json %v: stderr %q", json, errb.String())
		}
		want := `2026-11-24T23:15:05.019Z api seq=7 key=k\x1b1 a\nb\x1b[31m… (truncated: 8 of 40 bytes)
… 1234 events dropped (the terminal is too slow)
2026-11-24T23:15:06.000Z api seq=1242 key=k2 base64:/w==
… 1 event dropped (the terminal is too slow)
`
		if json {
			lines := strings.Split(stream, "\n")
			want = strings.Join([]string{lines[2], lines[3], lines[4], lines[5]}, "\n") + "\n"
		}
		if out.String() != want {
			t.Errorf("json %v: printed\n%s\nwant\n%s", json, out.String(), want)
		}
	}
}
