package sources

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// oauthRig is an http_poll source against a test upstream that takes
// OAuth2 tokens, with the source's debug log kept.
type oauthRig struct {
	auth *testupstream.OAuth2
	srv  *testupstream.Server
	src  Source
	logs *testsync.LockedBuffer
}

// newOAuthRig starts an upstream of 50 records whose tokens live ttl and
// opens an http_poll source on it with oauth (its token_url filled in).
func newOAuthRig(t *testing.T, ttl time.Duration, oauth OAuth2Spec) *oauthRig {
	t.Helper()
	r := &oauthRig{auth: &testupstream.OAuth2{ClientID: "ingestor", ClientSecret: "s3cret-client", TokenTTL: ttl, RefreshToken: "rt-first"},
		logs: &testsync.LockedBuffer{}}
	r.srv = testupstream.NewServer(t, testupstream.Options{Total: 50, PageSize: 10, OAuth2: r.auth})
	oauth.TokenURL = r.srv.URL + testupstream.TokenPath
	spec := &HTTPPollSpec{PollURL: r.srv.URL + "/feed", IDField: "id", CursorField: "seq", CursorParam: "since", OAuth2: &oauth}
	r.src = openPollEnv(t, spec, Env{Name: "feed", Timeout: 10 * time.Second,
		Logger: slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	return r
}

// fetch polls once and fails the test unless the poll succeeds.
func (r *oauthRig) fetch(t *testing.T, cursor string) *Batch {
	t.Helper()
	b, err := r.src.Fetch(t.Context(), cursor)
	if err != nil {
		t.Fatalf("fetch with cursor %q: %v", cursor, err)
	}
	return b
}

// checkNoSecretLeaked fails the test when a token or the client secret
// is in the source's log or in text.
func (r *oauthRig) checkNoSecretLeaked(t *testing.T, text ...string) {
	t.Helper()
	all := r.logs.String() + strings.Join(text, "\n")
	for _, secret := range append(r.auth.Stats().Tokens, "s3cret-client", "rt-first") {
		if strings.Contains(all, secret) {
			t.Errorf("%q leaked:\n%s", secret, all)
		}
	}
}

// TestOAuth2TokenBeforeTheFirstPollAndBeforeExpiry: client credentials
// with 2 s tokens. The first poll carries a token; polls that go on for
// several token lives never send an expired one (no 401), because a token
// is replaced halfway through a life this short; no token or secret is
// logged.
func TestOAuth2TokenBeforeTheFirstPollAndBeforeExpiry(t *testing.T) {
	r := newOAuthRig(t, 2*time.Second, OAuth2Spec{ClientID: "ingestor", ClientSecret: "s3cret-client", Scopes: []string{"read"}})
	cursor := r.fetch(t, "").Cursor
	if st := r.auth.Stats(); st.Issued != 1 || st.Unauthorized != 0 {
		t.Fatalf("after the first poll: %+v, want one token issued and no 401", st)
	}
	polls := 1
	testsync.WaitFor(t, "three more tokens", 20*time.Second, func() bool {
		if b := r.fetch(t, cursor); b.Cursor != "" {
			cursor = b.Cursor
		}
		polls++
		return r.auth.Stats().Issued >= 4
	})
	if st := r.auth.Stats(); st.Unauthorized != 0 {
		t.Errorf("%d polls over %d tokens: %d answered 401, want none", polls, st.Issued, st.Unauthorized)
	}
	r.checkNoSecretLeaked(t)
}

// TestOAuth2NewTokenOnceOnA401: the upstream revokes every token; the
// next poll is answered 401, gets a new token and is sent again, and
// succeeds: the 401 does not count as a failed poll.
func TestOAuth2NewTokenOnceOnA401(t *testing.T) {
	r := newOAuthRig(t, time.Hour, OAuth2Spec{ClientID: "ingestor", ClientSecret: "s3cret-client", AuthStyle: "params"})
	r.fetch(t, "")
	r.auth.Revoke()
	if b := r.fetch(t, ""); len(b.Records) != 10 {
		t.Errorf("the poll after a revocation got %d records, want 10", len(b.Records))
	}
	if st := r.auth.Stats(); st.Issued != 2 || st.Unauthorized != 1 {
		t.Errorf("%+v, want 2 tokens issued and one 401", st)
	}
	r.checkNoSecretLeaked(t)
}

// TestOAuth2RefreshTokenRotatesIntoItsFile: with the refresh_token grant,
// every refresh rotates the refresh token; the new one is written to
// refresh_token_file (mode 0600) before it is used, so a source opened
// again (a restart) refreshes with it, the first one being refused now.
func TestOAuth2RefreshTokenRotatesIntoItsFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "refresh")
	if err := os.WriteFile(file, []byte("rt-first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := OAuth2Spec{Grant: GrantRefreshToken, ClientID: "ingestor", ClientSecret: "s3cret-client", RefreshTokenFile: file}
	r := newOAuthRig(t, time.Hour, spec)
	r.fetch(t, "")
	r.auth.Revoke()
	r.fetch(t, "")
	st := r.auth.Stats()
	if st.Rotated != 2 || st.Refused != 0 {
		t.Fatalf("%+v, want two rotations and no refusal", st)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != r.auth.CurrentRefreshToken() {
		t.Errorf("refresh_token_file holds %q, want the newest %q", got, r.auth.CurrentRefreshToken())
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("refresh_token_file mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	spec.TokenURL = r.srv.URL + testupstream.TokenPath
	again := openPollEnv(t, &HTTPPollSpec{PollURL: r.srv.URL + "/feed", IDField: "id", OAuth2: &spec}, Env{Name: "feed", Timeout: 10 * time.Second})
	if _, err := again.Fetch(t.Context(), ""); err != nil {
		t.Fatalf("a source opened again on the file: %v", err)
	}
	r.checkNoSecretLeaked(t)
}

// TestOAuth2TokenEndpointErrors: a wrong client secret is a permanent
// error naming the endpoint's status and OAuth2 error, never the secret;
// a token endpoint that cannot be reached is an error to retry.
func TestOAuth2TokenEndpointErrors(t *testing.T) {
	r := newOAuthRig(t, time.Hour, OAuth2Spec{ClientID: "ingestor", ClientSecret: "wrong-secret"})
	_, err := r.src.Fetch(t.Context(), "")
	var perm *PermanentError
	if !errors.As(err, &perm) || !strings.Contains(err.Error(), "status 401 invalid_client") || strings.Contains(err.Error(), "wrong-secret") {
		t.Errorf("wrong secret: %v, want a permanent error with the status and invalid_client, without the secret", err)
	}
	if len(r.srv.Requests()) != 0 {
		t.Errorf("the API was asked %d times without a token", len(r.srv.Requests()))
	}

	closed := &HTTPPollSpec{PollURL: r.srv.URL + "/feed", OAuth2: &OAuth2Spec{ClientID: "ingestor", ClientSecret: "x",
		TokenURL: "http://" + testsync.FreePort(t) + testupstream.TokenPath}}
	src := openPoll(t, closed)
	_, err = src.Fetch(t.Context(), "")
	if err == nil || errors.As(err, &perm) || !strings.Contains(err.Error(), "oauth2 token from") {
		t.Errorf("token endpoint down: %v, want an error to retry naming the token endpoint", err)
	}
}

// TestOAuth2Validate: every problem of an [oauth2] table is reported with
// its key.
func TestOAuth2Validate(t *testing.T) {
	for _, tc := range []struct {
		spec    OAuth2Spec
		headers map[string]string
		want    []string
	}{
		{OAuth2Spec{}, nil, []string{"oauth2.client_secret", "oauth2.token_url", "oauth2.client_id"}},
		{OAuth2Spec{Grant: "password", TokenURL: "ftp://x/", ClientID: "c", ClientSecret: "s", ClientSecretFile: "f", AuthStyle: "basic", ExpiryMargin: "soon"},
			nil, []string{"oauth2.grant", "oauth2.token_url", "oauth2.client_secret_file", "oauth2.auth_style", "oauth2.expiry_margin"}},
		{OAuth2Spec{Grant: GrantRefreshToken, TokenURL: "https://x/t", ClientID: "c"}, nil, []string{"oauth2.refresh_token_file"}},
		{OAuth2Spec{TokenURL: "https://x/t", ClientID: "c", ClientSecret: "s", RefreshTokenFile: "f"},
			map[string]string{"authorization": "Bearer x"}, []string{"oauth2.refresh_token_file", "headers.authorization"}},
		{OAuth2Spec{TokenURL: "https://x/t", ClientID: "c", ClientSecretFile: "f"}, nil, nil},
	} {
		var got []string
		for _, e := range tc.spec.validate(tc.headers) {
			got = append(got, e.Key)
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%+v: problems with %v, want %v", tc.spec, got, tc.want)
		}
	}
}

// TestOAuth2WebSocketHandshake: a websocket source sends its token with
// the handshake; after the upstream revokes it and drops the connection,
// the handshake answered 401 is made once more with a new token and the
// feed goes on where it was.
func TestOAuth2WebSocketHandshake(t *testing.T) {
	auth := &testupstream.OAuth2{ClientID: "ingestor", ClientSecret: "s3cret-client", TokenTTL: time.Hour}
	feed := testupstream.NewWS(t, testupstream.WSOptions{Total: 20, OAuth2: auth})
	spec := newWebSocketSpec()
	spec.URL, spec.IDField, spec.CursorField, spec.Subscribe = feed.URL, "id", "seq", `{"since":"{cursor}"}`
	spec.OAuth2 = &OAuth2Spec{ClientID: "ingestor", ClientSecret: "s3cret-client",
		TokenURL: "http" + strings.TrimPrefix(feed.URL, "ws") + testupstream.TokenPath}
	src, err := spec.Open(Env{Name: "ws", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	got := map[string]bool{}
	cursor := ""
	take := func(n int) {
		t.Helper()
		testsync.WaitFor(t, "records from the feed", 20*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			b, err := src.Fetch(ctx, cursor)
			if err == nil {
				for _, rec := range b.Records {
					got[rec.Key] = true
				}
				if b.Cursor != "" {
					cursor = b.Cursor
				}
			}
			return len(got) >= n
		})
	}
	take(20)
	auth.Revoke()
	feed.Drop()
	testsync.WaitFor(t, "a handshake with a new token", 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		_, _ = src.Fetch(ctx, cursor)
		return len(feed.Connections()) >= 2
	})
	if st := auth.Stats(); st.Issued != 2 || st.Unauthorized != 1 {
		t.Errorf("%+v, want 2 tokens and one handshake answered 401", st)
	}
	if c := feed.Connections(); c[len(c)-1].Since != cursor {
		t.Errorf("the new connection asked from %q, want %q", c[len(c)-1].Since, cursor)
	}
}

// TestOAuth2SSEStream: an sse source sends its token with every request;
// after the upstream revokes it and drops the stream, the request
// answered 401 is sent once more with a new token, and the stream resumes
// from the id handed out: every event arrives.
func TestOAuth2SSEStream(t *testing.T) {
	auth := &testupstream.OAuth2{ClientID: "ingestor", ClientSecret: "s3cret-client", TokenTTL: time.Hour}
	feed := testupstream.NewSSE(t, testupstream.SSEOptions{Total: 50, Pace: 20 * time.Millisecond, OAuth2: auth})
	src := openSSE(t, sseSpec(feed.URL, func(s *SSESpec) {
		s.MaxBatch = 20
		s.OAuth2 = &OAuth2Spec{ClientID: "ingestor", ClientSecret: "s3cret-client", TokenURL: feed.URL + testupstream.TokenPath}
	}), Env{})
	c := &sseConsumer{t: t, src: src, feed: feed}
	for c.cursor == "" {
		c.fetch()
	}
	auth.Revoke()
	feed.Drop()
	c.until(seqRange(1, 50))
	if st := auth.Stats(); st.Issued != 2 || st.Unauthorized != 1 {
		t.Errorf("%+v, want 2 tokens and one request answered 401", st)
	}
	if hs := feed.Handshakes(); len(hs) != 2 || hs[1].LastEventID != c.handedOut[0] {
		t.Errorf("handshakes %+v, want 2, the second from the id handed out first (%q)", hs, c.handedOut[0])
	}
}
