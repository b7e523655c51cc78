package main

import (
	"fmt"
	"net/url"
	"os"
	"strconv"
	"sync"

	"github.com/ingestorhq/ingestor/processor"
)

// recorder is the -record file: one line per event handed to the handler,
//
//	SOURCE KEY DELIVERY
//
// separated by single spaces. SOURCE and KEY are percent-encoded as a URL
// path segment (url.PathEscape: a space is %20, a newline %0A, a percent
// sign %25, a slash %2F; letters, digits and -._~ stay as they are), so a
// field never holds a space or a newline and a line is always one event;
// url.PathUnescape or Python's urllib.parse.unquote decode them. DELIVERY
// is the delivery number of the frame that carried the event, 1 the first
// time. Each line is written with one write(2) to a
// file opened for appending before the event is acked, so it survives a
// kill of the processor.
type recorder struct {
	path string
	mu   sync.Mutex
	f    *os.File
	line []byte
}

func openRecorder(path string) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("-record: %w", err)
	}
	return &recorder{path: path, f: f}, nil
}

// record appends ev's line.
func (r *recorder) record(ev *processor.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.line = append(r.line[:0], url.PathEscape(ev.Source)...)
	r.line = append(r.line, ' ')
	r.line = append(r.line, url.PathEscape(ev.Key)...)
	r.line = append(r.line, ' ')
	r.line = strconv.AppendInt(r.line, int64(ev.Delivery), 10)
	r.line = append(r.line, '\n')
	if _, err := r.f.Write(r.line); err != nil {
		return fmt.Errorf("-record %s: record %s/%s: %w", r.path, ev.Source, ev.Key, err)
	}
	return nil
}

func (r *recorder) close() error {
	if err := r.f.Close(); err != nil {
		return fmt.Errorf("-record %s: close: %w", r.path, err)
	}
	return nil
}
