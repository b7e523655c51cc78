package testupstream

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Fault is a scripted answer to one request (see Server.Script). A Fault
// with Status 0 that is not Hang answers normally, with Header added.
type Fault struct {
	// Status is the status to answer with, and Body its body.
	Status int
	Body   string
	// Header is added to the response.
	Header http.Header
	// Hang holds the request until its context ends (the client gives up
	// or the server closes), answering nothing.
	Hang bool

	// retryDateIn makes Retry-After the HTTP date retryDateIn after the
	// request arrives.
	retryDateIn time.Duration
}

// Status answers with code and its status text.
func Status(code int) Fault { return Fault{Status: code, Body: http.StatusText(code)} }

// Body answers with status and body, as JSON.
func Body(status int, body string) Fault {
	return Fault{Status: status, Body: body, Header: http.Header{"Content-Type": {"application/json"}}}
}

// RetryAfter answers with status and Retry-After: secs (delta-seconds).
func RetryAfter(status, secs int) Fault {
	f := Status(status)
	f.Header = http.Header{"Retry-After": {strconv.Itoa(secs)}}
	return f
}

// RetryAfterDate answers with status and Retry-After as an HTTP date, in
// after the request arrives (HTTP dates have whole seconds: the time is
// rounded down).
func RetryAfterDate(status int, in time.Duration) Fault {
	f := Status(status)
	f.retryDateIn = in
	return f
}

// Hang holds the request until its context ends.
func Hang() Fault { return Fault{Hang: true} }

// Oversize answers 200 with a valid JSON array of more than n bytes.
func Oversize(n int) Fault {
	elem := `"` + strings.Repeat("x", 1022) + `"`
	count := n/(len(elem)+1) + 1
	return Body(http.StatusOK, "["+strings.Repeat(elem+",", count-1)+elem+"]")
}

// RateLimited answers normally, with X-RateLimit-Remaining: remaining and
// X-RateLimit-Reset: reset (unix seconds or seconds from now).
func RateLimited(remaining int, reset string) Fault {
	return Fault{Header: http.Header{
		"X-Ratelimit-Remaining": {strconv.Itoa(remaining)},
		"X-Ratelimit-Reset":     {reset},
	}}
}

// response plans the fault's answer to a request that arrived at now.
func (f *Fault) response(now time.Time) response {
	if f.Hang {
		return response{hang: true}
	}
	h := http.Header{}
	for name, vals := range f.Header {
		h[name] = vals
	}
	if f.retryDateIn > 0 {
		h.Set("Retry-After", now.Add(f.retryDateIn).UTC().Format(http.TimeFormat))
	}
	return response{status: f.Status, header: h, body: []byte(f.Body)}
}
