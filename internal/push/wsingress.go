package push

import (
	"net/http"

	"github.com/ingestorhq/ingestor/sources"
)

// wsIngress serves a kind "ws_ingress" source. Not built yet: the
// skeleton answers 501 so that the listener and its routing can be tested.
type wsIngress struct{}

func newWSIngress(handlerEnv, *sources.WSIngressSpec) (handler, error) { return wsIngress{}, nil }

func (wsIngress) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	WriteError(w, http.StatusNotImplemented, "ws_ingress: not implemented yet")
}

func (wsIngress) Close() {}
