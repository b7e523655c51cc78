package sources

import (
	"context"
	"fmt"
)

// PushSpec is the Spec of a push kind (webhook, ws_ingress): the upstream
// sends to the daemon's push listener ([push] addr), so no SourceActor
// polls it and it keeps no cursor. Package internal/push serves it.
type PushSpec interface {
	Spec
	// Authenticated reports whether every request to the source must
	// prove its sender (a bearer token or a signature). A push listener
	// beyond loopback serves only authenticated sources.
	Authenticated() bool
}

// pushSource is what Open returns for a push kind: it has nothing to
// fetch, so a caller that polls it (check-source) gets a clear error.
type pushSource struct{ name, kind string }

func (s pushSource) Fetch(context.Context, string) (*Batch, error) {
	return nil, &PermanentError{Err: fmt.Errorf("source %q is kind %q: its upstream pushes to the push listener, there is nothing to poll", s.name, s.kind)}
}

func (pushSource) Close() error { return nil }

// MinTokenLen is the shortest bearer token accepted (a push source's
// token, the admin token), so that a placeholder such as "changeme" is not
// mistaken for protection.
const MinTokenLen = 16

// CheckToken returns what is wrong with a bearer token, or "". It never
// quotes the token.
func CheckToken(token string) string {
	if len(token) < MinTokenLen {
		return fmt.Sprintf("must be at least %d characters (e.g. the output of `openssl rand -hex 32`)", MinTokenLen)
	}
	for i := range len(token) {
		if c := token[i]; c <= ' ' || c > '~' {
			return "must be printable ASCII without spaces (it is sent in an HTTP header)"
		}
	}
	return ""
}
