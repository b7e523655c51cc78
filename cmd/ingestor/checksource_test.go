package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/testupstream"
)

func TestCheckSourceCommand(t *testing.T) {
	feed := testupstream.New(t, 30, 25)
	dir := t.TempDir()
	cfgPath := writeConfig(t, dir, `
[source.feed]
kind = "http_poll"
poll_url = "`+feed.URL+`"
id_field = "id"
cursor_field = "seq"
cursor_param = "since"
time_field = "ts"
`)
	// NAME may come before or after the flags.
	for _, args := range [][]string{
		{"check-source", "feed", "-c", cfgPath},
		{"check-source", "-c", cfgPath, "feed"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("%q: exit %d\n%s%s", args, code, out.String(), errb.String())
		}
		for _, want := range []string{
			"GET " + feed.URL + " -> 200 in ",
			"25 record(s)",
			"id=" + testupstream.ID(1) + " cursor=1 time=2026-11-22T00:00:01Z",
			"... and 5 more (-v lists them all)",
			`next cursor: "25"`,
			`ok: 1 page(s), 1 request(s), 25 record(s), next cursor "25"`,
		} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%q: output lacks %q:\n%s", args, want, out.String())
			}
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"check-source", "feed", "-c", cfgPath, "-cursor", "25", "-v"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "id="+testupstream.ID(30)+" cursor=30") {
		t.Errorf("-cursor 25: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if got := feed.Requests(); len(got) != 3 || got[2] != "25" {
		t.Errorf("upstream saw since=%q", got)
	}
	// Nothing was written: no data dir (so no queue), no raw dir.
	for _, d := range []string{"data", "raw"} {
		if _, err := os.Stat(filepath.Join(dir, d)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("check-source created %s: %v", d, err)
		}
	}

	feed.ServeMalformed(testupstream.NotJSON)
	out.Reset()
	errb.Reset()
	if code := run([]string{"check-source", "feed", "-c", cfgPath}, &out, &errb); code != 1 ||
		!strings.Contains(out.String(), "problem: malformed payload") || !strings.Contains(errb.String(), "ingestor check-source: ") {
		t.Errorf("malformed payload: exit %d\n%s%s", code, out.String(), errb.String())
	}

	for _, args := range [][]string{
		{"check-source", "-c", cfgPath},
		{"check-source", "feed"},
		{"check-source", "feed", "other", "-c", cfgPath},
		{"check-source", "feed", "-c", cfgPath, "-max-pages", "0"},
	} {
		out.Reset()
		errb.Reset()
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("%q: exit %d, want 2\n%s", args, code, errb.String())
		}
	}
}

// TestCheckSourceFailedHandshake checks a websocket source whose every
// handshake is answered 400: that is a problem (exit 1) shown with the
// status, a hint and the URL as sent, query included and its secret
// redacted, and no daemon log line mixes into the output.
func TestCheckSourceFailedHandshake(t *testing.T) {
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 5})
	refusals := make([]testupstream.Fault, 200) // more than one check makes
	for i := range refusals {
		refusals[i] = testupstream.Status(400)
	}
	feed.Script(refusals...)
	cfgPath := writeConfig(t, t.TempDir(), `
[source.stream]
kind = "websocket"
url = "`+feed.URL+`/events?since=5&api_key=s3cret"
id_field = "id"
`)
	var out, errb bytes.Buffer
	code := run([]string{"check-source", "stream", "-c", cfgPath}, &out, &errb)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	sent := "WS " + feed.URL + "/events?api_key=REDACTED&since=5"
	for _, want := range []string{
		sent + " -> 400 in ",
		`problem: source "stream": ` + sent + ": status 400: ",
		"hint: 400: check url, headers and credentials",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	for _, bad := range []string{"ok: ", "s3cret", "level=", "msg="} {
		if strings.Contains(out.String()+errb.String(), bad) {
			t.Errorf("output has %q", bad)
		}
	}
	if !strings.HasPrefix(errb.String(), "ingestor check-source: ") || strings.Count(errb.String(), "\n") != 1 {
		t.Errorf("stderr is not the one error line")
	}
	if hs := feed.Handshakes(); len(hs) == 0 || hs[0].Query.Get("api_key") != "s3cret" || hs[0].Query.Get("since") != "5" {
		t.Errorf("handshakes %+v, want the URL with its query", hs)
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	}
}
