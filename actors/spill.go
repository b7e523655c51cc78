package actors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ingestorhq/ingestor/internal/durable"
)

// spillMetaSuffix ends the name of a spilled batch's sidecar; a raw key
// never ends with it.
const spillMetaSuffix = ".spill.json"

// spillInfo is the sidecar of a spilled batch: why it is on local disk
// rather than in the raw store.
type spillInfo struct {
	// Key is the batch's raw store key (and its path under the spill dir).
	Key string `json:"key"`
	// Source is the source that fetched the batch.
	Source string `json:"source"`
	// Error is the last raw store error.
	Error string `json:"error"`
	// Attempts is how many raw store writes failed before the spill.
	Attempts     int       `json:"attempts"`
	FirstAttempt time.Time `json:"first_attempt"`
	LastAttempt  time.Time `json:"last_attempt"`
	SpilledAt    time.Time `json:"spilled_at"`
	// DeadLetterReason is set for a malformed payload: once it is in the
	// raw store, it is recorded in the dead-letter list with this reason.
	DeadLetterReason string `json:"dead_letter_reason,omitempty"`
	// DeadLetterCursor is the cursor the malformed payload was fetched with.
	DeadLetterCursor string `json:"dead_letter_cursor,omitempty"`
}

// spillDir keeps batches the raw store could not take, one file per batch
// named by its raw key, with a JSON sidecar, until they are re-driven.
type spillDir struct {
	dir string
}

// path returns the file of key, which is a clean relative path.
func (s *spillDir) path(key string) string {
	return filepath.Join(s.dir, filepath.FromSlash(key))
}

// write makes body durable under key with durable.WriteFile, then its
// sidecar.
func (s *spillDir) write(key string, body []byte, info spillInfo) error {
	meta, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return fmt.Errorf("spill %s: %w", key, err)
	}
	p := s.path(key)
	if err := durable.WriteFile(p, body); err != nil {
		return fmt.Errorf("spill %s: %w", key, err)
	}
	if err := durable.WriteFile(p+spillMetaSuffix, append(meta, '\n')); err != nil {
		return fmt.Errorf("spill %s: sidecar: %w", key, err)
	}
	return nil
}

// remove deletes key's files, the payload first so that a crash in
// between leaves a sidecar without a payload, which load discards, and
// then the directories it leaves empty.
func (s *spillDir) remove(key string) error {
	p := s.path(key)
	for _, f := range []string{p, p + spillMetaSuffix} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove spilled batch: %w", err)
		}
	}
	root := filepath.Clean(s.dir)
	for d := filepath.Dir(p); d != root && strings.HasPrefix(d, root); d = filepath.Dir(d) {
		if err := os.Remove(d); err != nil {
			break // not empty (or already gone): the rest of the tree stays
		}
	}
	return nil
}

// spilled is a batch found in the spill dir.
type spilled struct {
	key  string
	info spillInfo // zero when the sidecar is missing or unreadable
}

// load lists the spilled batches, removing what a crash left half done:
// temp files and sidecars without a payload. A missing dir holds none.
func (s *spillDir) load() ([]spilled, error) {
	var out []spilled
	err := filepath.WalkDir(s.dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if p == s.dir && errors.Is(err, fs.ErrNotExist) {
				return filepath.SkipDir
			}
			return err
		}
		name := e.Name()
		switch {
		case e.IsDir():
			return nil
		case durable.IsTemp(name): // left incomplete by a crash
			return os.Remove(p)
		case strings.HasSuffix(name, spillMetaSuffix):
			if _, err := os.Stat(strings.TrimSuffix(p, spillMetaSuffix)); errors.Is(err, fs.ErrNotExist) {
				return os.Remove(p)
			}
			return nil
		}
		rel, err := filepath.Rel(s.dir, p)
		if err != nil {
			return err
		}
		b := spilled{key: filepath.ToSlash(rel)}
		if meta, err := os.ReadFile(p + spillMetaSuffix); err == nil {
			if err := json.Unmarshal(meta, &b.info); err != nil {
				b.info = spillInfo{}
			}
		}
		out = append(out, b)
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("read spill dir %s: %w", s.dir, err)
	}
	return out, nil
}
