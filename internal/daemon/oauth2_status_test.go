package daemon

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
	"github.com/ingestorhq/ingestor/internal/testupstream"
)

// TestOAuth2TokenErrorShowsInStatus: a source whose client secret the
// token endpoint refuses is failing in /status with the endpoint's status
// and OAuth2 error as its last error, as a configuration problem (backed
// off to its cap), and neither the secret nor the API was sent anything
// it should not have been: the API got no request at all.
func TestOAuth2TokenErrorShowsInStatus(t *testing.T) {
	auth := &testupstream.OAuth2{ClientID: "ingestor", ClientSecret: "the-right-secret", TokenTTL: time.Hour}
	srv := testupstream.NewServer(t, testupstream.Options{Total: 10, OAuth2: auth})
	h := startDaemon(t, "", "", fmt.Sprintf(`
[source.locked]
kind = "http_poll"
poll_url = %q
interval = "200ms"
id_field = "id"

[source.locked.oauth2]
token_url = %q
client_id = "ingestor"
client_secret = "a-wrong-secret-value"
`, srv.URL+"/feed", srv.URL+testupstream.TokenPath))
	var st SourceStatus
	testsync.WaitFor(t, "the token error in /status", 30*time.Second, func() bool {
		st = getStatus(t, h.d.HTTPAddr()).Sources[0]
		return st.State == "failing"
	})
	if !strings.Contains(st.LastError, "oauth2 token from") || !strings.Contains(st.LastError, "status 401 invalid_client") {
		t.Errorf("last_error %q, want the token endpoint's status and error", st.LastError)
	}
	if st.Until == nil || time.Until(*st.Until) < time.Minute {
		t.Errorf("next attempt at %v, want a configuration problem's capped backoff", st.Until)
	}
	if strings.Contains(fmt.Sprintf("%+v", getStatus(t, h.d.HTTPAddr())), "a-wrong-secret-value") || strings.Contains(h.logs.String(), "a-wrong-secret-value") {
		t.Error("the client secret is in /status or the logs")
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("the API got %d requests without a token", n)
	}
}
