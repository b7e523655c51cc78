package push

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxCRCToken is the longest crc_token answered.
const maxCRCToken = 255

// slackChallenge answers body when it is a Slack Events API
// url_verification, {"type": "url_verification", "challenge": C}, with
// {"challenge": C}, and reports whether it did (then nothing is stored).
// It runs after the signature check.
func (h *webhook) slackChallenge(w http.ResponseWriter, r *http.Request, reqID string, body []byte) bool {
	if !bytes.Contains(body, []byte("url_verification")) {
		return false
	}
	var msg struct {
		Type      string `json:"type"`
		Challenge string `json:"challenge"`
	}
	if err := json.Unmarshal(body, &msg); err != nil || msg.Type != "url_verification" {
		return false
	}
	if msg.Challenge == "" {
		h.reject(w, r, reqID, http.StatusBadRequest, "url_verification without a challenge")
		return true
	}
	h.env.log.Debug("webhook: answered a Slack url_verification", "request_id", reqID)
	h.env.metrics.Requests.WithLabelValues(h.name, "200").Inc()
	WriteJSON(w, http.StatusOK, struct {
		Challenge string `json:"challenge"`
	}{msg.Challenge})
	return true
}

// crc answers GET /ingest/NAME?crc_token=T, the challenge-response check
// of X (Twitter): {"response_token": "sha256=" + the base64 HMAC-SHA256 of
// T with the first secret not past its not_after}. T must be 1 to 255
// printable ASCII characters without '{' or '[': no JSON body has neither,
// so the answer can never be a valid signature of an event.
func (h *webhook) crc(w http.ResponseWriter, r *http.Request, reqID string) {
	if !r.URL.Query().Has("crc_token") {
		w.Header().Set("Allow", "GET, POST")
		h.reject(w, r, reqID, http.StatusMethodNotAllowed, "POST events to /ingest/"+h.name+", or GET it with ?crc_token=TOKEN")
		return
	}
	token := r.URL.Query().Get("crc_token")
	if token == "" || len(token) > maxCRCToken || !printable(token, false) || strings.ContainsAny(token, "{[") {
		h.reject(w, r, reqID, http.StatusBadRequest, "crc_token must be 1 to "+strconv.Itoa(maxCRCToken)+" printable ASCII characters, without spaces, '{' or '['")
		return
	}
	now := time.Now()
	for _, k := range h.crcKeys {
		if !k.NotAfter.IsZero() && now.After(k.NotAfter) {
			continue
		}
		h.env.log.Debug("webhook: answered a CRC challenge", "request_id", reqID)
		h.env.metrics.Requests.WithLabelValues(h.name, "200").Inc()
		WriteJSON(w, http.StatusOK, struct {
			ResponseToken string `json:"response_token"`
		}{"sha256=" + base64.StdEncoding.EncodeToString(hmacOf(sha256.New, k.Key, []byte(token)))})
		return
	}
	h.reject(w, r, reqID, http.StatusServiceUnavailable, "every secret of the source is past its not_after")
}
