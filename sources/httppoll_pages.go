package sources

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

// pollCursor is the decoded form of an http_poll cursor. Between polls it
// is only Start, stored as the plain value (as the first version of
// http_poll stored it), so a stored "123" reads as the cursor 123. In the
// middle of a paginated poll it is stored as a JSON object that also
// carries the page state.
type pollCursor struct {
	// Start is the cursor the poll started with, sent with all its pages.
	Start string `json:"c,omitempty"`
	// Found is the cursor found on the poll's pages so far; it becomes Start
	// of the next poll once the last page is durable.
	Found string `json:"f,omitempty"`
	// Next is the next page to fetch: a URL (path and query), a token, a
	// page number or an offset; "" means the first page of a poll.
	Next string `json:"n,omitempty"`
	// Pages is how many pages of this poll were fetched.
	Pages int `json:"k,omitempty"`
	// Mode is the pagination mode Next belongs to.
	Mode string `json:"m,omitempty"`
}

// decodeCursor reads a stored cursor. Anything that is not one of the JSON
// objects encode writes is a plain cursor value.
func decodeCursor(s string) pollCursor {
	if strings.HasPrefix(s, "{") {
		var c pollCursor
		d := json.NewDecoder(strings.NewReader(s))
		d.DisallowUnknownFields()
		if d.Decode(&c) == nil && !d.More() && c.Pages >= 0 {
			return c
		}
	}
	return pollCursor{Start: s}
}

// encode writes c for storage: the plain value between polls (unless it
// could be mistaken for a JSON object), a JSON object otherwise.
func (c pollCursor) encode() string {
	if c.Next == "" && c.Found == "" && c.Pages == 0 && c.Mode == "" && !strings.HasPrefix(c.Start, "{") {
		return c.Start // "" for no cursor at all
	}
	b, err := json.Marshal(c)
	if err != nil {
		panic(err) // strings and an int always marshal
	}
	return string(b)
}

// foundCursor folds a page's cursor into the cursor found so far: record
// cursors keep the largest, body and header cursors the latest.
func (p *httpPoll) foundCursor(sofar, found string) string {
	switch {
	case found == "":
		return sofar
	case sofar == "" || p.spec.CursorFrom != "record" || CompareCursor(found, sofar) > 0:
		return found
	}
	return sofar
}

// finalCursor is the cursor of the next poll once all of this one's pages
// are durable. A record cursor never moves backwards: an upstream that
// answers with older records than asked for (or a cursor field mixing kinds
// of values) must not rewind it. Keeping it can only cause re-fetches,
// never a skip.
func (p *httpPoll) finalCursor(c pollCursor) string {
	if c.Found == "" {
		return c.Start
	}
	if p.spec.CursorFrom == "record" && c.Start != "" && CompareCursor(c.Found, c.Start) < 0 {
		p.log.Warn("records are older than the cursor; keeping the cursor", "cursor", c.Start, "largest_found", c.Found)
		return c.Start
	}
	return c.Found
}

// hasMore reports whether the body says, at HasMoreField, that the upstream
// has more after this page and the cursor moved, so the caller polls again
// at once with the new cursor. A cursor that did not move would only fetch
// the same page again, so it waits for the interval.
func (p *httpPoll) hasMore(body []byte, c pollCursor, found string) bool {
	if p.spec.HasMoreField == "" || found == "" || found == c.Start {
		return false
	}
	val, kind, ok := jsonscan.Field(body, p.spec.HasMoreField)
	return ok && kind == jsonscan.Bool && string(val) == "true"
}

// nextPage works out the page after this response, or "" at the end.
// reqURL is the URL just requested, cur the page state it was requested
// with.
func (p *httpPoll) nextPage(resp *http.Response, b *Batch, reqURL *url.URL, cur string) (string, error) {
	switch p.spec.Pagination {
	case "link":
		for _, v := range resp.Header.Values("Link") {
			if next := linkNext(v); next != "" {
				return p.nextURL(reqURL, next)
			}
		}
	case "body_url":
		if next := scalarField(b.Body, p.spec.NextURLField); next != "" {
			return p.nextURL(reqURL, next)
		}
	case "body_token":
		if tok := scalarField(b.Body, p.spec.NextTokenField); tok != "" && tok != cur {
			return tok, nil
		}
	case "page":
		if b.RecordCount() > 0 {
			n := p.spec.PageStart
			if cur != "" {
				n, _ = strconv.Atoi(cur) // cur is one we wrote
			}
			return strconv.Itoa(n + 1), nil
		}
	case "offset":
		if n := b.RecordCount(); n > 0 {
			start, _ := strconv.Atoi(cur) // cur is one we wrote, or "" for 0
			return strconv.Itoa(start + n), nil
		}
	}
	return "", nil
}

// nextURL resolves a next page URL and keeps it as a path and query, minus
// the fixed parameters that the request adds back, so that secrets in them
// are not stored in the cursor. A URL on another scheme or host is refused
// (the headers carry credentials), and one equal to the URL just requested
// ends the poll.
func (p *httpPoll) nextURL(reqURL *url.URL, next string) (string, error) {
	ref, err := url.Parse(next)
	if err != nil {
		// The page's records are good: keep them, and end the poll.
		p.log.Warn("the next page URL is not a URL; ending the poll here", "error", unwrapURLError(err))
		return "", nil
	}
	u := reqURL.ResolveReference(ref)
	if u.Scheme != p.base.Scheme || u.Host != p.base.Host {
		return "", &PermanentError{Err: fmt.Errorf("%s: next page %s refused: %w", p.where, redactURL(u), errOtherHost)}
	}
	if u.String() == reqURL.String() {
		return "", nil
	}
	q := u.Query()
	for name, vals := range p.fixedQuery {
		if got, ok := q[name]; ok && len(got) == len(vals) && strings.Join(got, "\x00") == strings.Join(vals, "\x00") {
			delete(q, name)
		}
	}
	u.RawQuery = q.Encode()
	u.Scheme, u.Host, u.User, u.Fragment = "", "", nil, ""
	return u.RequestURI(), nil
}

// linkNext returns the target of the rel="next" link in an RFC 8288 Link
// header value, or "".
func linkNext(v string) string {
	for _, link := range splitUnquoted(v, ',') {
		link = strings.TrimSpace(link)
		if !strings.HasPrefix(link, "<") {
			continue
		}
		end := strings.IndexByte(link, '>')
		if end < 0 {
			continue
		}
		for _, param := range splitUnquoted(link[end+1:], ';') {
			name, val, ok := strings.Cut(param, "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "rel") {
				continue
			}
			for _, rel := range strings.Fields(strings.Trim(strings.TrimSpace(val), `"`)) {
				if strings.EqualFold(rel, "next") {
					return link[1:end]
				}
			}
		}
	}
	return ""
}

// splitUnquoted splits s at each sep that is outside a quoted string and
// outside <...>.
func splitUnquoted(s string, sep byte) []string {
	var out []string
	inQuote, inURI, start := false, false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case inQuote && c == '\\':
			i++ // an escaped character
		case inQuote:
			inQuote = c != '"'
		case inURI:
			inURI = c != '>'
		case c == '"':
			inQuote = true
		case c == '<':
			inURI = true
		case c == sep:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// scalarField returns the text of the string or number at path in rec: a
// string unescaped, a number as written. It is "" when path is "", absent,
// or holds another kind of value.
func scalarField(rec []byte, path string) string {
	if path == "" {
		return ""
	}
	val, kind, ok := jsonscan.Field(rec, path)
	switch {
	case !ok:
		return ""
	case kind == jsonscan.Number:
		return string(val)
	case kind == jsonscan.String:
		s, err := jsonscan.Unquote(val)
		if err != nil {
			return "" // cannot happen: the record was validated
		}
		return s
	}
	return ""
}
