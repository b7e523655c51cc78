package push

import (
	"net/http"

	"github.com/ingestorhq/ingestor/sources"
)

// webhook serves a kind "webhook" source. Not built yet: the skeleton
// answers 501 so that the listener and its routing can be tested.
type webhook struct{}

func newWebhook(handlerEnv, *sources.WebhookSpec) (handler, error) { return webhook{}, nil }

func (webhook) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	WriteError(w, http.StatusNotImplemented, "webhook: not implemented yet")
}

func (webhook) Close() {}
