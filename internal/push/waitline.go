package push

import (
	"slices"
	"sync"
)

// waitLine holds the commits waiting for a group, one line per source, and
// shares its places fairly between the sources. Alone, a source may take
// every place; once they are all taken, a source holding fewer than its
// fair share (the places divided among the sources with commits waiting,
// itself included) still gets in: the newest commit of the source holding
// the most is pushed out in its place (answered "retry later", as if
// refused on arrival: nothing of it was stored or read). A group takes
// the commits waiting up to its caps, and when a cap cuts it short, each
// source with commits waiting gets an equal part of it (a source with
// fewer waiting leaves its unused part to the others), its oldest commits
// first. So a flood of devices on one source cannot hold every place
// while a webhook source on the same daemon is refused, nor make the
// webhook's requests wait behind several groups of theirs.
//
// A commit that can wait (a device's envelope: its connection is not read
// meanwhile) is not refused when the line is full: it waits for a place,
// first come first served, and gets the first free one; pushed out, it
// waits again, first in line.
type waitLine struct {
	mu     sync.Mutex
	filled sync.Cond // signalled when a commit is added or the line closes
	places int
	total  int
	// lines holds each source's commits, the oldest first; active the
	// sources with commits waiting.
	lines  map[string]*sourceLine
	active []*sourceLine
	// waiters are the commits waiting for a place, the oldest first.
	waiters []*waiter
	closed  bool
}

// sourceLine is one source's commits waiting, the oldest first.
type sourceLine struct {
	name    string
	commits []*commit
}

// waiter is a commit waiting for a place: placed is closed once it has
// one, or once the line is closed (then closed is set first). A commit let
// in and then pushed out waits with placed nil: nobody waits for it but
// the commit's caller, for its outcome.
type waiter struct {
	c      *commit
	placed chan struct{}
	closed bool
}

// addResult is what add did with a commit.
type addResult int

const (
	lineAdded  addResult = iota // it waits for a group
	lineFull                    // no place for it: refused
	lineClosed                  // the line is closed
	lineGaveUp                  // it waited for a place until its caller stopped waiting
)

func newWaitLine(places int) *waitLine {
	l := &waitLine{places: places, lines: make(map[string]*sourceLine)}
	l.filled.L = &l.mu
	return l
}

// add puts c in the line. When the line is full and c's source holds its
// fair share of it, c is refused (lineFull) or, with hold non-nil, waits for a
// place until hold is closed (lineGaveUp). pushed is a commit that lost its
// place to c, to be answered busy.
func (l *waitLine) add(c *commit, hold <-chan struct{}) (res addResult, pushed *commit) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return lineClosed, nil
	}
	if l.total >= l.places {
		var room bool
		if room, pushed = l.pushOut(c.source); !room {
			if hold == nil {
				l.mu.Unlock()
				return lineFull, nil
			}
			w := &waiter{c: c, placed: make(chan struct{})}
			l.waiters = append(l.waiters, w)
			l.mu.Unlock()
			return l.await(w, hold), nil
		}
	}
	l.put(c)
	l.mu.Unlock()
	return lineAdded, pushed
}

// await waits until w has a place, the line closes or hold is closed.
func (l *waitLine) await(w *waiter, hold <-chan struct{}) addResult {
	select {
	case <-w.placed:
	case <-hold:
		l.mu.Lock()
		defer l.mu.Unlock()
		if i := slices.Index(l.waiters, w); i >= 0 {
			l.waiters = slices.Delete(l.waiters, i, i+1)
			return lineGaveUp
		}
		// It got its place (or the line closed) meanwhile.
	}
	if w.closed {
		return lineClosed
	}
	return lineAdded
}

// put appends c to its source's line. l.mu is held.
func (l *waitLine) put(c *commit) {
	s := l.lines[c.source]
	if s == nil {
		s = &sourceLine{name: c.source}
		l.lines[c.source] = s
	}
	if len(s.commits) == 0 {
		l.active = append(l.active, s)
	}
	s.commits = append(s.commits, c)
	l.total++
	l.filled.Signal()
}

// pushOut makes room for a commit of source in the full line, when source
// holds less than its fair share, by taking out the newest commit of the
// source holding the most: one that can wait waits again, first in line,
// any other is returned, to be answered busy. l.mu is held.
func (l *waitLine) pushOut(source string) (room bool, pushed *commit) {
	var holds int
	if s := l.lines[source]; s != nil {
		holds = len(s.commits)
	}
	sources := len(l.active)
	if holds == 0 {
		sources++
	}
	if holds >= l.places/sources {
		return false, nil
	}
	// The line is full and s holds less than its share, so another source
	// holds more than its share: at least one commit.
	var most *sourceLine
	for _, a := range l.active {
		if most == nil || len(a.commits) > len(most.commits) {
			most = a
		}
	}
	last := len(most.commits) - 1
	c := most.commits[last]
	most.commits[last] = nil
	most.commits = most.commits[:last]
	l.total--
	if last == 0 {
		l.deactivate(most)
	}
	if c.patient {
		l.waiters = slices.Insert(l.waiters, 0, &waiter{c: c})
		return true, nil
	}
	return true, c
}

// deactivate removes s, now empty, from the active sources. l.mu is held.
func (l *waitLine) deactivate(s *sourceLine) {
	l.active = slices.DeleteFunc(l.active, func(a *sourceLine) bool { return a == s })
	s.commits = nil
}

// take waits until commits wait or the line is closed, and appends to
// group the commits of the next group: up to maxCommits commits and about
// maxBytes of bodies, each source's share as waitLine says. It returns
// group unchanged (empty) once the line is closed and empty.
func (l *waitLine) take(group []*commit, maxCommits, maxBytes int) []*commit {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.total == 0 && !l.closed {
		l.filled.Wait()
	}
	// Water-filling: the sources with the fewest commits waiting first,
	// each taking at most an equal part of what the group has left.
	order := slices.Clone(l.active)
	slices.SortStableFunc(order, func(a, b *sourceLine) int { return len(a.commits) - len(b.commits) })
	left, size := maxCommits, 0
	for i, s := range order {
		n := min(len(s.commits), left/(len(order)-i))
		taken := 0
		for taken < n && size < maxBytes {
			size += len(s.commits[taken].body)
			taken++
		}
		group = append(group, s.commits[:taken]...)
		clear(s.commits[:taken])
		s.commits = s.commits[taken:]
		l.total -= taken
		left -= taken
		if len(s.commits) == 0 {
			l.deactivate(s)
		}
	}
	// The places just freed go to the commits waiting for one.
	for len(l.waiters) > 0 && l.total < l.places {
		w := l.waiters[0]
		l.waiters[0] = nil
		l.waiters = l.waiters[1:]
		l.put(w.c)
		if w.placed != nil {
			close(w.placed)
		}
	}
	return group
}

// len returns how many commits wait.
func (l *waitLine) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// isClosed reports whether close was called.
func (l *waitLine) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// close takes no more commits and turns away those waiting for a place;
// take hands out those in the line, then returns empty groups.
func (l *waitLine) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for _, w := range l.waiters {
		if w.placed == nil {
			l.put(w.c) // let in already: it is committed with the rest
			continue
		}
		w.closed = true
		close(w.placed)
	}
	l.waiters = nil
	l.filled.Broadcast()
}
