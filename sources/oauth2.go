package sources

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/ingestorhq/ingestor/internal/durable"
)

// OAuth2Spec is the [source.NAME.oauth2] table of an http_poll, websocket
// or sse source: the source gets an OAuth2 access token before its
// first request, sends it as "Authorization: Bearer TOKEN", gets a new one
// before it expires, and once more when a request is answered 401 before
// the request counts as failed. The grant itself (the token request, the
// client authentication, the token response) is golang.org/x/oauth2's.
// Tokens and secrets are never logged, traced or shown in /status.
type OAuth2Spec struct {
	// Grant is "client_credentials" (the default) or "refresh_token".
	Grant string `toml:"grant"`
	// TokenURL is the token endpoint; required, http or https. It is
	// requested with the source's TLS settings.
	TokenURL string `toml:"token_url"`
	// ClientID is the client's id; required.
	ClientID string `toml:"client_id"`
	// ClientSecret is the client's secret, usually "${ENV}"; or
	// ClientSecretFile. A client without a secret (a public client of the
	// refresh_token grant) sets neither.
	ClientSecret string `toml:"client_secret"`
	// ClientSecretFile is a file holding the client's secret (surrounding
	// white space is dropped), such as a mounted Kubernetes Secret.
	ClientSecretFile string `toml:"client_secret_file"`
	// Scopes are the scopes asked for.
	Scopes []string `toml:"scopes"`
	// EndpointParams are more form parameters of every token request, such
	// as audience or resource; values may use ${ENV}.
	EndpointParams map[string]string `toml:"endpoint_params"`
	// AuthStyle is how the client authenticates to the token endpoint:
	// "header" (HTTP Basic), "params" (client_id and client_secret in the
	// form) or "auto" (the default: Basic first, then the form, remembered).
	AuthStyle string `toml:"auth_style"`
	// RefreshTokenFile holds the refresh token of the refresh_token grant;
	// required with it. When the token endpoint rotates the refresh token,
	// the new one is written back to this file (fsynced, then renamed over
	// it, mode 0600) before it is used, so a restart uses the newest.
	RefreshTokenFile string `toml:"refresh_token_file"`
	// ExpiryMargin is how long before its expiry a token is replaced.
	// Default "30s"; a token that lives less than twice as long is replaced
	// halfway through its life.
	ExpiryMargin string `toml:"expiry_margin"`
}

// The grants OAuth2Spec takes.
const (
	GrantClientCredentials = "client_credentials"
	GrantRefreshToken      = "refresh_token"
)

// defaultExpiryMargin is OAuth2Spec.ExpiryMargin's default.
const defaultExpiryMargin = 30 * time.Second

// validate returns the problems of s, with keys relative to the source
// block ("oauth2.token_url").
func (s *OAuth2Spec) validate(headers map[string]string) []FieldError {
	var errs []FieldError
	add := func(key, msg string) { errs = append(errs, FieldError{"oauth2." + key, msg}) }
	switch s.Grant {
	case "", GrantClientCredentials:
		if s.RefreshTokenFile != "" {
			add("refresh_token_file", `is only used with grant = "refresh_token"`)
		}
		if s.ClientSecret == "" && s.ClientSecretFile == "" {
			add("client_secret", `is required with grant = "client_credentials" (or set client_secret_file)`)
		}
	case GrantRefreshToken:
		if s.RefreshTokenFile == "" {
			add("refresh_token_file", `is required with grant = "refresh_token"`)
		}
	default:
		add("grant", fmt.Sprintf(`must be "client_credentials" or "refresh_token", not %q`, s.Grant))
	}
	if u, err := url.Parse(s.TokenURL); s.TokenURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		add("token_url", "must be an absolute http:// or https:// URL")
	}
	if s.ClientID == "" {
		add("client_id", "is required")
	}
	if s.ClientSecret != "" && s.ClientSecretFile != "" {
		add("client_secret_file", "cannot be set with client_secret: set one")
	}
	switch s.AuthStyle {
	case "", "auto", "header", "params":
	default:
		add("auth_style", fmt.Sprintf(`must be "auto", "header" or "params", not %q`, s.AuthStyle))
	}
	if s.ExpiryMargin != "" {
		if d, err := time.ParseDuration(s.ExpiryMargin); err != nil || d < 0 {
			add("expiry_margin", fmt.Sprintf("must be a duration such as \"30s\", not %q", s.ExpiryMargin))
		}
	}
	for name := range headers {
		if strings.EqualFold(name, "Authorization") {
			errs = append(errs, FieldError{"headers." + name, "cannot be set with [oauth2], which sends the Authorization header"})
		}
	}
	return errs
}

// oauth2Token is an open OAuth2Spec: one token cache for the source,
// shared by all its requests.
type oauth2Token struct {
	spec   OAuth2Spec
	fetch  func(ctx context.Context) (*oauth2.Token, error)
	client *http.Client
	margin time.Duration
	log    *slog.Logger
	trace  func(TraceEvent)
	where  string // names the token endpoint in errors, without its query

	mu        sync.Mutex
	tok       *oauth2.Token
	replaceAt time.Time // when tok is replaced; zero: never (no expiry)
	// refresh is the refresh token of the refresh_token grant, the newest
	// the endpoint gave (and written to RefreshTokenFile).
	refresh string
}

// openOAuth2 opens s for the source env names, its token requests sent
// over transport.
func openOAuth2(s *OAuth2Spec, env Env, transport http.RoundTripper, logger *slog.Logger) (*oauth2Token, error) {
	o := &oauth2Token{spec: *s, margin: defaultExpiryMargin, log: logger, trace: env.Trace}
	if s.ExpiryMargin != "" {
		o.margin, _ = time.ParseDuration(s.ExpiryMargin) // validated
	}
	u, _ := url.Parse(s.TokenURL) // validated
	o.where = fmt.Sprintf("source %q: oauth2 token from %s", env.Name, redactURL(u))
	o.client = &http.Client{Transport: env.transport(transport), Timeout: env.Timeout}
	secret := s.ClientSecret
	if s.ClientSecretFile != "" {
		b, err := os.ReadFile(s.ClientSecretFile)
		if err != nil {
			return nil, fmt.Errorf("oauth2.client_secret_file: %w", err)
		}
		secret = strings.TrimSpace(string(b))
	}
	style := map[string]oauth2.AuthStyle{"header": oauth2.AuthStyleInHeader, "params": oauth2.AuthStyleInParams}[s.AuthStyle]
	if s.Grant == GrantRefreshToken {
		b, err := os.ReadFile(s.RefreshTokenFile)
		if err != nil {
			return nil, fmt.Errorf("oauth2.refresh_token_file: %w", err)
		}
		if o.refresh = strings.TrimSpace(string(b)); o.refresh == "" {
			return nil, fmt.Errorf("oauth2.refresh_token_file: %s is empty", s.RefreshTokenFile)
		}
		cfg := &oauth2.Config{ClientID: s.ClientID, ClientSecret: secret, Scopes: s.Scopes,
			Endpoint: oauth2.Endpoint{TokenURL: s.TokenURL, AuthStyle: style}}
		o.fetch = o.refreshGrant(cfg)
		return o, nil
	}
	params := url.Values{}
	for k, v := range s.EndpointParams {
		params.Set(k, v)
	}
	cfg := &clientcredentials.Config{ClientID: s.ClientID, ClientSecret: secret, TokenURL: s.TokenURL,
		Scopes: s.Scopes, EndpointParams: params, AuthStyle: style}
	o.fetch = cfg.Token
	return o, nil
}

// refreshGrant returns the fetch of the refresh_token grant: a new access
// token for the newest refresh token, and a rotated refresh token written
// back to RefreshTokenFile before it is kept.
func (o *oauth2Token) refreshGrant(cfg *oauth2.Config) func(ctx context.Context) (*oauth2.Token, error) {
	return func(ctx context.Context) (*oauth2.Token, error) {
		tok, err := cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: o.refresh}).Token()
		if err != nil {
			return nil, err
		}
		if tok.RefreshToken != "" && tok.RefreshToken != o.refresh {
			if err := durable.WriteFile(o.spec.RefreshTokenFile, []byte(tok.RefreshToken+"\n")); err != nil {
				// The endpoint may have revoked the old token already: keep the
				// new one in memory, and say that a restart may need a new one.
				o.log.Error("oauth2: the rotated refresh token could not be written back; after a restart the source may need a new one in oauth2.refresh_token_file",
					"file", o.spec.RefreshTokenFile, "err", err)
			}
			o.refresh = tok.RefreshToken
		}
		return tok, nil
	}
}

// token returns the access token to send: the cached one until its
// replacement time, else a new one from the token endpoint.
func (o *oauth2Token) token(ctx context.Context) (*oauth2.Token, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	if o.tok != nil && (o.replaceAt.IsZero() || now.Before(o.replaceAt)) {
		return o.tok, nil
	}
	start := time.Now()
	ev := TraceEvent{Method: http.MethodPost, URL: traceURL(mustParse(o.spec.TokenURL)), Note: "oauth2 token (" + o.grant() + ")"}
	tok, err := o.fetch(context.WithValue(ctx, oauth2.HTTPClient, o.client))
	ev.Duration = time.Since(start)
	if err != nil {
		err = o.tokenError(err, &ev)
	} else if tok.AccessToken == "" {
		err = fmt.Errorf("%s: the answer holds no access_token", o.where)
	}
	ev.Err = err
	if ev.Status == 0 && err == nil {
		ev.Status = http.StatusOK
	}
	if o.trace != nil {
		o.trace(ev)
	}
	if err != nil {
		return nil, err
	}
	o.tok, o.replaceAt = tok, time.Time{}
	if !tok.Expiry.IsZero() {
		margin := min(o.margin, tok.Expiry.Sub(start)/2)
		o.replaceAt = tok.Expiry.Add(-margin)
	}
	o.log.Debug("oauth2 token fetched", "grant", o.grant(), "expires_in", time.Until(tok.Expiry).Round(time.Second))
	return tok, nil
}

// tokenError is an OAuth2 token request's error, already the source's
// error as it is to be returned.
type tokenError struct{ err error }

func (e *tokenError) Error() string { return e.err.Error() }
func (e *tokenError) Unwrap() error { return e.err }

// send sends req through client with a token. An answer 401 drops the
// token and req is sent once more with a new one, before that answer
// counts; again reports the second send. The 401 answer is handed to
// discard. A token request's error is a *tokenError.
func (o *oauth2Token) send(client *http.Client, req *http.Request, discard func(*http.Response)) (resp *http.Response, again bool, err error) {
	tok, err := o.token(req.Context())
	if err != nil {
		return nil, false, &tokenError{err}
	}
	tok.SetAuthHeader(req)
	resp, err = client.Do(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, false, err
	}
	discard(resp)
	o.invalidate(tok)
	if tok, err = o.token(req.Context()); err != nil {
		return nil, true, &tokenError{err}
	}
	retry := req.Clone(req.Context())
	if req.GetBody != nil {
		if retry.Body, err = req.GetBody(); err != nil {
			return nil, true, err
		}
	}
	tok.SetAuthHeader(retry)
	resp, err = client.Do(retry)
	return resp, true, err
}

// invalidate drops tok, an access token a request was refused with, so
// that the next token is a new one; a newer token is kept.
func (o *oauth2Token) invalidate(tok *oauth2.Token) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.tok == tok {
		o.tok = nil
	}
}

// grant names the grant in traces and logs.
func (o *oauth2Token) grant() string {
	if o.spec.Grant == "" {
		return GrantClientCredentials
	}
	return o.spec.Grant
}

// tokenError turns a failed token request into the source's error, with
// the endpoint's status and OAuth2 error code but never its body, which
// may echo what was sent. A 4xx other than 408 and 429 (wrong client id
// or secret, a revoked refresh token) is a PermanentError: asking again
// soon will not fix it.
func (o *oauth2Token) tokenError(err error, ev *TraceEvent) error {
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) || re.Response == nil {
		return fmt.Errorf("%s: %w", o.where, unwrapURLError(err))
	}
	status := re.Response.StatusCode
	ev.Status = status
	msg := fmt.Sprintf("%s: status %d", o.where, status)
	if re.ErrorCode != "" {
		msg += " " + re.ErrorCode
	}
	out := errors.New(msg)
	if status >= 400 && status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests {
		return &PermanentError{Err: out}
	}
	return out
}

// mustParse parses a URL validate accepted.
func mustParse(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		return &url.URL{}
	}
	return u
}
