package rawstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ingestorhq/ingestor/internal/durable"
)

// Appender is a Store that appends payloads to an open segment object of
// their source (PageAppender's page segments) instead of creating one
// object per payload. Creating a file is the dear part of a small durable
// write (on this project's machines a file created, fsynced, renamed and
// its directory fsynced costs about 1 ms of CPU; appending to an open file
// and fsyncing it, 0.2 ms), so polled pages and the push inbox's groups
// are appended when the store can. Segments written by older versions for
// push sources (<source>/<yyyy>/<mm>/<dd>/<unix-nanos>-segment.jsonl,
// bodies one after the other without headers) are still read with Get.
type Appender interface {
	Store
	// Close closes the open segments.
	Close() error
}

func segmentKey(source string, at time.Time, suffix string) string {
	t := at.UTC()
	return fmt.Sprintf("%s/%04d/%02d/%02d/%d%s", source, t.Year(), int(t.Month()), t.Day(), t.UnixNano(), suffix)
}

// segment is one source's open segment file.
type segment struct {
	mu   sync.Mutex
	f    *os.File
	key  string
	size int
	// fileSize is the file's length: size, plus the zeros written ahead
	// of the appends (zeroAhead).
	fileSize int
	// day is the UTC day the segment's key names: a payload of another
	// day starts a new segment.
	day time.Time
	// opened is when the file was created, for Options.SegmentMaxAge.
	opened time.Time
}

// segments holds a file store's open segments, by kind and source.
type segments struct {
	mu     sync.Mutex
	open   map[segmentID]*segment
	closed bool
}

// segmentKind is what a segment holds, with its key suffix and size: page
// records (pages.go), today the only kind written.
type segmentKind struct {
	suffix   string
	maxBytes int
}

var pageSegments = segmentKind{suffix: pageSegmentSuffix, maxBytes: PageSegmentMaxBytes}

// segmentID names an open segment.
type segmentID struct {
	kind   segmentKind
	source string
}

// reserve returns the open segment of kind and source, locked, and the
// offset the next append goes to (a new segment when the open one is full,
// of another day or too old); the caller must call the segment's write
// once, which unlocks it.
func (s *fileStore) reserve(ctx context.Context, kind segmentKind, source string, at time.Time) (*segment, int, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	s.segs.mu.Lock()
	if s.segs.closed {
		s.segs.mu.Unlock()
		return nil, 0, errors.New("closed")
	}
	if s.segs.open == nil {
		s.segs.open = make(map[segmentID]*segment)
	}
	id := segmentID{kind, source}
	seg := s.segs.open[id]
	if seg == nil {
		seg = &segment{}
		s.segs.open[id] = seg
	}
	s.segs.mu.Unlock()

	seg.mu.Lock()
	day := at.UTC().Truncate(24 * time.Hour)
	old := s.segMaxAge > 0 && time.Since(seg.opened) >= s.segMaxAge
	if seg.f != nil && (seg.size >= kind.maxBytes || !seg.day.Equal(day) || old) {
		if err := seg.close(); err != nil {
			seg.mu.Unlock()
			return nil, 0, fmt.Errorf("close %s: %w", seg.key, err)
		}
	}
	if seg.f == nil {
		if err := s.openSegment(seg, kind, source, at); err != nil {
			seg.mu.Unlock()
			return nil, 0, err
		}
		seg.day = day
	}
	return seg, seg.size, nil
}

// write writes parts at off, the offset reserve returned, syncs them with
// sync (durable.Datasync or DatasyncParked) and unlocks seg.
func (seg *segment) write(off int, parts [][]byte, sync func(*os.File) error) error {
	defer seg.mu.Unlock()
	end := off
	err := seg.zeroAhead(parts)
	if err == nil {
		err = durable.WriteAt(seg.f, parts, int64(end))
	}
	for _, p := range parts {
		end += len(p)
	}
	if err == nil {
		err = sync(seg.f)
	}
	if err != nil {
		// What was written past off may be partial: no later payload
		// goes after it. Nothing references it, since the caller commits
		// only after the write returns.
		err = errors.Join(err, seg.f.Close())
		seg.f = nil
		return fmt.Errorf("write %s: %w", seg.key, err)
	}
	seg.fileSize = max(seg.fileSize, end)
	seg.size = end
	return nil
}

// openSegment creates a new, empty segment file of kind for source and
// makes its directory entry durable before anything is appended to it.
func (s *fileStore) openSegment(seg *segment, kind segmentKind, source string, at time.Time) error {
	for try := 0; ; try++ {
		key := segmentKey(source, at.Add(time.Duration(try)), kind.suffix)
		p, err := s.path(key)
		if err != nil {
			return err
		}
		dir := filepath.Dir(p)
		if err := durable.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if errors.Is(err, fs.ErrExist) && try < 1000 {
			continue // a segment opened at the same nanosecond
		}
		if err != nil {
			return err
		}
		if err := durable.SyncDir(dir); err != nil {
			return errors.Join(err, f.Close())
		}
		seg.f, seg.key, seg.size, seg.fileSize, seg.opened = f, key, 0, 0, time.Now()
		return nil
	}
}

// Close implements Appender: it closes the open segments; a later Append
// fails.
func (s *fileStore) Close() error {
	s.segs.mu.Lock()
	defer s.segs.mu.Unlock()
	s.segs.closed = true
	var errs []error
	for _, seg := range s.segs.open {
		seg.mu.Lock()
		if seg.f != nil {
			errs = append(errs, seg.close())
		}
		seg.mu.Unlock()
	}
	return errors.Join(errs...)
}

const (
	// zeroAheadMax is the largest append that goes into zeros written
	// ahead, and zeroAheadChunk how many are written at a time.
	//
	// fsync after an append that grows a file commits the file system's
	// journal (the new size, the new blocks) besides writing the data: on
	// this project's machines 290 us for a 7 KB append, against 205 us
	// for fdatasync after writing over bytes the file already holds,
	// zeros written ahead included. The push inbox appends a group of
	// small bodies per commit, so its raw write costs a journal commit
	// less per group: ingestor-bench -mode webhook served 8-10% more
	// requests per second in alternating runs. A large page (a polled page
	// is often hundreds of KB) is appended past the end as before: its
	// data is the larger part of the cost, and writing zeros ahead of it
	// would write it twice.
	zeroAheadMax   = 64 << 10
	zeroAheadChunk = 1 << 20
)

// zeroChunk is what zeroAhead writes.
var zeroChunk = make([]byte, zeroAheadChunk)

// zeroAhead writes zeros past the end of seg's file when parts, to be
// appended, are small and do not fit in the zeros written before, so
// that writing them changes no block or size of the file (zeroAheadMax).
// A segment closed by the store is cut back to its size; one left open
// by a crash ends in up to zeroAheadChunk zeros, which ReadPages and
// FindPage take for its end.
func (seg *segment) zeroAhead(parts [][]byte) error {
	need := 0
	for _, p := range parts {
		need += len(p)
	}
	if need > zeroAheadMax {
		return nil
	}
	for seg.size+need > seg.fileSize {
		if _, err := seg.f.WriteAt(zeroChunk, int64(seg.fileSize)); err != nil {
			return err
		}
		seg.fileSize += len(zeroChunk)
	}
	return nil
}

// close cuts the zeros written ahead off seg's file and closes it. The
// cut need not be durable: zeros a crash leaves at the end read as its
// end.
func (seg *segment) close() error {
	var err error
	if seg.fileSize > seg.size {
		err = seg.f.Truncate(int64(seg.size))
	}
	err = errors.Join(err, seg.f.Close())
	seg.f = nil
	return err
}
