package testupstream

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"
)

// TokenPath is where a server with OAuth2 set serves its token endpoint.
const TokenPath = "/oauth/token"

// OAuth2 makes a Server or a WSFeed an OAuth2-protected API: it serves a
// token endpoint at TokenPath (client credentials and refresh-token
// grants, with rotated refresh tokens), and answers every other request
// 401 unless it carries "Authorization: Bearer TOKEN" with a token it
// issued that has not expired. An expired token is refused, as real APIs
// do, so a client that uses a token past its life sees the 401.
type OAuth2 struct {
	// ClientID and ClientSecret are the client's credentials, taken in an
	// HTTP Basic header or as form parameters.
	ClientID, ClientSecret string
	// TokenTTL is an access token's life, sent as expires_in (whole
	// seconds, at least 1).
	TokenTTL time.Duration
	// RefreshToken is the refresh token the refresh_token grant takes
	// first. Each use rotates it: the answer carries a new one, and the
	// old one is refused from then on.
	RefreshToken string

	mu     sync.Mutex
	issued map[string]time.Time // access token -> expiry
	stats  OAuth2Stats
}

// OAuth2Stats count what an OAuth2 authority did.
type OAuth2Stats struct {
	// Issued counts the access tokens issued; Rotated the refresh tokens
	// replaced.
	Issued, Rotated int
	// Refused counts token requests refused (wrong client, a refresh
	// token already used); Unauthorized the API requests answered 401,
	// of which Expired carried a token past its life.
	Refused, Unauthorized, Expired int
	// Tokens are every access and refresh token issued, for tests that
	// check none of them leaks into a log.
	Tokens []string
}

// Stats returns what a has done so far.
func (a *OAuth2) Stats() OAuth2Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.stats
	s.Tokens = append([]string(nil), a.stats.Tokens...)
	return s
}

// CurrentRefreshToken returns the refresh token the grant takes now.
func (a *OAuth2) CurrentRefreshToken() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.RefreshToken
}

// Revoke makes every access token issued so far invalid, as a server that
// rotates its keys would: the next request with one is answered 401.
func (a *OAuth2) Revoke() {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(a.issued)
}

// intercept serves r when a, if set, has to: a token request, or a request
// without a valid token (answered 401). It reports whether it did.
func (a *OAuth2) intercept(w http.ResponseWriter, r *http.Request) bool {
	if a == nil {
		return false
	}
	if r.URL.Path == TokenPath {
		a.serveToken(w, r)
		return true
	}
	return !a.authorized(w, r)
}

// serveToken answers a token request.
func (a *OAuth2) serveToken(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Method != http.MethodPost {
		tokenError(w, http.StatusBadRequest, "invalid_request")
		return
	}
	id, secret, basic := r.BasicAuth()
	if !basic {
		id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if id != a.ClientID || (a.ClientSecret != "" && secret != a.ClientSecret) {
		a.stats.Refused++
		tokenError(w, http.StatusUnauthorized, "invalid_client")
		return
	}
	answer := map[string]any{"token_type": "Bearer", "expires_in": max(1, int(a.TokenTTL/time.Second))}
	switch r.PostForm.Get("grant_type") {
	case "client_credentials":
	case "refresh_token":
		if a.RefreshToken == "" || r.PostForm.Get("refresh_token") != a.RefreshToken {
			a.stats.Refused++
			tokenError(w, http.StatusBadRequest, "invalid_grant")
			return
		}
		a.RefreshToken = "rt-" + randomHex()
		a.stats.Rotated++
		a.stats.Tokens = append(a.stats.Tokens, a.RefreshToken)
		answer["refresh_token"] = a.RefreshToken
	default:
		tokenError(w, http.StatusBadRequest, "unsupported_grant_type")
		return
	}
	tok := "at-" + randomHex()
	if a.issued == nil {
		a.issued = map[string]time.Time{}
	}
	a.issued[tok] = time.Now().Add(time.Duration(answer["expires_in"].(int)) * time.Second)
	a.stats.Issued++
	a.stats.Tokens = append(a.stats.Tokens, tok)
	answer["access_token"] = tok
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(answer) // a client gone away is its own problem
}

// authorized reports whether r carries a token a issued that has not
// expired, and answers 401 when it does not.
func (a *OAuth2) authorized(w http.ResponseWriter, r *http.Request) bool {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	a.mu.Lock()
	expiry, issued := a.issued[tok]
	valid := ok && issued && time.Now().Before(expiry)
	if !valid {
		a.stats.Unauthorized++
		if issued {
			a.stats.Expired++
		}
	}
	a.mu.Unlock()
	if !valid {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		http.Error(w, "invalid or expired token", http.StatusUnauthorized)
	}
	return valid
}

// tokenError writes an OAuth2 error answer.
func tokenError(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code})
}

// randomHex returns 16 random bytes in hex.
func randomHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics instead)
	return hex.EncodeToString(b[:])
}
