package rawstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ErrCorrupt is what every *CorruptError unwraps to: stored bytes that no
// longer match the checksum written with them (bit rot, a truncated file
// or upload). They must never be sent as an event's payload.
var ErrCorrupt = errors.New("raw object corrupt")

// CorruptError reports stored bytes that no longer match their checksum:
// an object whose SHA-256 is not the one its key (Key) names, a page whose
// CRC-32C is not its header's, or a page segment that cannot be read up
// to a page it holds.
type CorruptError struct {
	// Key is the object's key.
	Key string
	// Off is the offset of a page's body in its page segment, or -1 when
	// the damage is not one page's.
	Off int
	// What names the damage: "sha256 mismatch", "page crc mismatch",
	// "page truncated" or "page header unreadable".
	What string
	// Detail says what was found, for logs and reports.
	Detail string
}

func (e *CorruptError) Error() string { return e.Reason() + ": " + e.Detail }

// Unwrap returns ErrCorrupt.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// Reason is the short form of the error, for a dead letter's reason:
// "raw object corrupt: WHAT: KEY", with "@OFF" after a page's key.
func (e *CorruptError) Reason() string {
	where := e.Key
	if e.Off >= 0 {
		where += "@" + strconv.Itoa(e.Off)
	}
	return ErrCorrupt.Error() + ": " + e.What + ": " + where
}

// checkObject returns a *CorruptError when key has Key's form and body's
// SHA-256 does not start with the hash in it. Other keys (segments, page
// segments, keys made otherwise) carry no hash and pass.
func checkObject(key string, body []byte) error {
	want, ok := keyHash(key)
	if !ok {
		return nil
	}
	sum := sha256.Sum256(body)
	if got := hex.EncodeToString(sum[:len(want)/2]); got != want {
		return &CorruptError{Key: key, Off: -1, What: "sha256 mismatch",
			Detail: fmt.Sprintf("its %d bytes hash to %s…, the key says %s…", len(body), got, want)}
	}
	return nil
}

// keyHash returns the hex SHA-256 prefix that Key puts in a key:
// .../<unix-nanos>-<32 hex digits>.json.
func keyHash(key string) (string, bool) {
	nanos, rest, ok := strings.Cut(path.Base(key), "-")
	h, json := strings.CutSuffix(rest, ".json")
	if !ok || !json || len(h) != 32 || nanos == "" || strings.Trim(nanos, "0123456789") != "" ||
		strings.Trim(h, "0123456789abcdef") != "" {
		return "", false
	}
	return h, true
}

// PageReader is a Store that reads one page record of a page segment,
// found by an offset in its body, without reading the rest of the
// segment: a backlog frame's events are checked against their page's
// checksum at the cost of their page, not of their 16 MiB segment.
type PageReader interface {
	// FindPage returns where the body of the page record of page segment
	// key that holds offset off is, with its checksum. It reads only the
	// record headers that ix does not hold yet. The error wraps
	// fs.ErrNotExist when nothing is stored under key, and is a
	// *CorruptError when the segment cannot be read up to off.
	FindPage(ctx context.Context, key string, off int, ix *PageIndex) (PageRef, error)
	// ReadPage returns the body of the page record at ref in page
	// segment key, checked against ref's checksum: the error is a
	// *CorruptError when it does not match or the segment ends inside it.
	ReadPage(ctx context.Context, key string, ref PageRef) ([]byte, error)
}

// PageRef locates a page record's body in its page segment.
type PageRef struct {
	// Off and Len are the body's offset in the segment and its length.
	Off, Len int
	// Sum is the body's CRC-32C from the record's header.
	Sum uint32
	// FetchedAt is when the page was fetched.
	FetchedAt time.Time
}

// PageIndex holds the PageRefs that FindPage found: a page segment only
// grows, so a record once found stays where it is. The zero value is
// empty and ready to use; a PageIndex is not safe for concurrent use.
type PageIndex struct {
	segs map[string]*pageList
	// refs counts the PageRefs held in all segs.
	refs int
}

// pageList is what a PageIndex knows of one segment: its first records,
// in order, and where the header after them starts.
type pageList struct {
	refs []PageRef
	end  int
}

// find returns the ref whose body holds off.
func (l *pageList) find(off int) (PageRef, bool) {
	i := sort.Search(len(l.refs), func(i int) bool { return l.refs[i].Off+l.refs[i].Len > off })
	if i < len(l.refs) && l.refs[i].Off <= off {
		return l.refs[i], true
	}
	return PageRef{}, false
}

const (
	// maxIndexedSegments and maxIndexedPages bound a PageIndex (the
	// pages to some 40 MiB, for a source whose pages are tiny): past
	// either, it forgets every segment and starts over.
	maxIndexedSegments = 256
	maxIndexedPages    = 1 << 20
	// maxPageHeader bounds a page record's header line.
	maxPageHeader = 512
)

// FindPage implements PageReader.
func (s *fileStore) FindPage(ctx context.Context, key string, off int, ix *PageIndex) (PageRef, error) {
	ref, err := s.findPage(ctx, key, off, ix)
	if err != nil {
		return PageRef{}, fmt.Errorf("raw store %s: find the page of %q at offset %d: %w", s, key, off, err)
	}
	return ref, nil
}

func (s *fileStore) findPage(ctx context.Context, key string, off int, ix *PageIndex) (PageRef, error) {
	if err := ctx.Err(); err != nil {
		return PageRef{}, err
	}
	if ix.segs == nil || len(ix.segs) >= maxIndexedSegments || ix.refs >= maxIndexedPages {
		ix.segs, ix.refs = make(map[string]*pageList), 0
	}
	l := ix.segs[key]
	if l == nil {
		l = &pageList{}
		ix.segs[key] = l
	}
	if ref, ok := l.find(off); ok {
		return ref, nil
	}
	corrupt := func(what, detail string, args ...any) error {
		return &CorruptError{Key: key, Off: -1, What: what, Detail: fmt.Sprintf(detail, args...)}
	}
	if off < l.end {
		return PageRef{}, corrupt("page header unreadable", "offset %d is in a record header, not in a page", off)
	}
	p, err := s.path(key)
	if err != nil {
		return PageRef{}, err
	}
	f, err := os.Open(p)
	if err != nil {
		return PageRef{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return PageRef{}, err
	}
	size := int(fi.Size())
	buf := make([]byte, maxPageHeader)
	for l.end <= off {
		n, err := f.ReadAt(buf, int64(l.end))
		if err != nil && !errors.Is(err, io.EOF) {
			return PageRef{}, err
		}
		nl := bytes.IndexByte(buf[:n], '\n')
		if nl < 0 && n < len(buf) {
			return PageRef{}, corrupt("page truncated", "the %d-byte segment ends inside the record header at offset %d", size, l.end)
		}
		if nl < 0 {
			return PageRef{}, corrupt("page header unreadable", "no record header line at offset %d", l.end)
		}
		bn, sum, fetched, err := parsePageHeader(string(buf[:nl]))
		if err != nil {
			return PageRef{}, corrupt("page header unreadable", "record at offset %d: %v", l.end, err)
		}
		ref := PageRef{Off: l.end + nl + 1, Len: bn, Sum: sum, FetchedAt: time.Unix(0, fetched).UTC()}
		if ref.Off+ref.Len+1 > size {
			return PageRef{}, &CorruptError{Key: key, Off: ref.Off, What: "page truncated",
				Detail: fmt.Sprintf("the %d-byte segment ends inside the %d-byte page", size, ref.Len)}
		}
		l.refs = append(l.refs, ref)
		l.end = ref.Off + ref.Len + 1
		ix.refs++
	}
	if ref, ok := l.find(off); ok {
		return ref, nil
	}
	return PageRef{}, corrupt("page header unreadable", "offset %d is in a record header, not in a page", off)
}

// ReadPage implements PageReader.
func (s *fileStore) ReadPage(ctx context.Context, key string, ref PageRef) ([]byte, error) {
	b, err := s.getRange(ctx, key, ref.Off, ref.Len)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = &CorruptError{Key: key, Off: ref.Off, What: "page truncated", Detail: fmt.Sprintf("the segment ends inside the %d-byte page", ref.Len)}
	}
	if err == nil {
		err = checkPage(key, ref.Off, b, ref.Sum)
	}
	if err != nil {
		return nil, fmt.Errorf("raw store %s: read the page of %q at offset %d: %w", s, key, ref.Off, err)
	}
	return b, nil
}

// checkPage returns a *CorruptError when body, the page at off in page
// segment key, does not have the CRC-32C sum.
func checkPage(key string, off int, body []byte, sum uint32) error {
	if got := crc32.Checksum(body, crc32c); got != sum {
		return &CorruptError{Key: key, Off: off, What: "page crc mismatch",
			Detail: fmt.Sprintf("its %d bytes have checksum %08x, the header says %08x: the bytes changed on disk", len(body), got, sum)}
	}
	return nil
}
