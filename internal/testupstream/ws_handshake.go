package testupstream

import (
	"net/http"
	"time"
)

// Script queues faults for the feed's handshakes: the next len(faults)
// handshakes are answered with them, in order (a Fault with Status 0
// that is not Hang lets its handshake through), then handshakes are
// accepted again. RetryAfter and RetryAfterDate answer a handshake with a
// status and Retry-After in either form.
func (f *WSFeed) Script(faults ...Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.script = append(f.script, faults...)
}

// Handshakes returns every handshake request received so far, oldest
// first, with when it arrived, its URL (path and query) and the status a
// scripted fault answered (0 when it was let through to the upgrade).
func (f *WSFeed) Handshakes() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Request(nil), f.handshakes...)
}

// handshake records the handshake request r and answers it with the next
// scripted fault, if any; it reports whether it answered.
func (f *WSFeed) handshake(w http.ResponseWriter, r *http.Request) bool {
	req := Request{Time: time.Now(), Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Header: r.Header.Clone()}
	f.mu.Lock()
	var fault *Fault
	if len(f.script) > 0 {
		fault = &f.script[0]
		f.script = f.script[1:]
	}
	answer := fault != nil && (fault.Status != 0 || fault.Hang)
	var resp response
	if answer {
		resp = fault.response(req.Time)
		req.Status = resp.status
	}
	f.handshakes = append(f.handshakes, req)
	f.mu.Unlock()
	if !answer {
		return false
	}
	if resp.hang {
		select {
		case <-r.Context().Done():
		case <-f.ctx.Done():
		}
		return true
	}
	for name, vals := range resp.header {
		w.Header()[name] = vals
	}
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body) // a client gone away is its own problem
	return true
}
