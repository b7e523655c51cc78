package devicewire

import (
	"encoding/json"
	"fmt"
)

// The statuses of an answer to an envelope.
const (
	// StatusStored: the envelope is durable at the daemon (a duplicate
	// event_id is answered so again); the device forgets it.
	StatusStored = "stored"
	// StatusRejected: the envelope is invalid and nothing was stored; the
	// device never sends it again.
	StatusRejected = "rejected"
	// StatusRetry: nothing was stored now; the device sends the envelope
	// again after RetryAfterMS.
	StatusRetry = "retry"
)

// Ack is the daemon's answer to one envelope, one text message each,
// matched to its envelope by EventID.
type Ack struct {
	EventID string `json:"event_id"`
	Status  string `json:"status"`
	// AckTS is when a "stored" answer was sent (RFC 3339).
	AckTS string `json:"ack_ts,omitempty"`
	// Reason says why an envelope is "rejected" or to "retry".
	Reason string `json:"reason,omitempty"`
	// RetryAfterMS is how long a "retry" envelope waits before it is sent
	// again.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

// Encode returns the answer as the text of a WebSocket message.
func (a Ack) Encode() []byte {
	b, err := json.Marshal(a)
	if err != nil { // a struct of strings and an integer: cannot happen
		panic(fmt.Sprintf("encode an envelope answer: %v", err))
	}
	return b
}

// DecodeAck reads an answer: a JSON object whose unknown keys are
// ignored. A status other than the three is not an error here: the
// device decides what to do with it.
func DecodeAck(data []byte) (Ack, error) {
	var a Ack
	if err := json.Unmarshal(data, &a); err != nil {
		return Ack{}, fmt.Errorf("decode an answer: %w", err)
	}
	return a, nil
}
