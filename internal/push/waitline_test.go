package push

import (
	"fmt"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

// lineCommit is a commit of source with body key, for the line's tests.
func lineCommit(source, key string) *commit {
	return &commit{source: source, body: []byte(key), done: make(chan commitResult, 1)}
}

// fill adds n commits of source to l, keyed source-0, source-1, ...
func fill(t *testing.T, l *waitLine, source string, n int) {
	t.Helper()
	for i := range n {
		if res, pushed := l.add(lineCommit(source, fmt.Sprintf("%s-%d", source, i)), nil); res != lineAdded || pushed != nil {
			t.Fatalf("add %s-%d: %v, pushed %v", source, i, res, pushed)
		}
	}
}

// perSource counts a group's commits by source and checks that each
// source's come oldest first: next holds the number of each source's
// next commit due, and is advanced.
func perSource(t *testing.T, next map[string]int, group []*commit) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, c := range group {
		if want := fmt.Sprintf("%s-%d", c.source, next[c.source]); string(c.body) != want {
			t.Errorf("commit %s of %s taken where %s was due", c.body, c.source, want)
		}
		next[c.source]++
		n[c.source]++
	}
	return n
}

// TestWaitLineGroupsShareBetweenSources: a group holds every source's
// oldest commits, each source an equal part of it, a source with fewer
// waiting leaving the rest of its part to the others. A single request of
// a trickle is thus in the next group however many a burst has waiting
// (first come first served put it behind the burst's whole backlog: four
// groups of 1024 with the default 4096 places).
func TestWaitLineGroupsShareBetweenSources(t *testing.T) {
	l := newWaitLine(8192)
	next := map[string]int{}
	fill(t, l, "burst", 3000)
	fill(t, l, "trickle", 1)
	if got := perSource(t, next, l.take(nil, 1024, 1<<20)); got["trickle"] != 1 || got["burst"] != 1023 {
		t.Errorf("first group: %v, want the trickle's commit and 1023 of the burst's", got)
	}
	fill(t, l, "small", 10)
	fill(t, l, "middle", 600)
	// Left: burst 1977, small 10, middle 600. Parts of 1024: small 10, then
	// (1024-10)/2 = 507 each for middle and burst.
	got := perSource(t, next, l.take(nil, 1024, 1<<20))
	if got["small"] != 10 || got["middle"] != 507 || got["burst"] != 507 {
		t.Errorf("second group: %v, want small 10, middle 507, burst 507", got)
	}
	// The byte cap cuts a group short (the bodies are 7-10 bytes).
	if g := l.take(nil, 1024, 40); len(g) < 4 || len(g) > 6 {
		t.Errorf("a group capped at 40 bytes took %d commits", len(g))
	}
}

// TestWaitLineHoldsPatientCommits: in a full line, a commit that may wait
// (hold non-nil) waits for a place instead of being refused, first come
// first served, gets one as soon as a group frees it, and leaves without
// one when its hold is closed or the line closes.
func TestWaitLineHoldsPatientCommits(t *testing.T) {
	l := newWaitLine(2)
	next := map[string]int{}
	fill(t, l, "dev", 2)
	if res, _ := l.add(lineCommit("dev", "x"), nil); res != lineFull {
		t.Fatalf("an impatient commit in a full line: %v, want refused", res)
	}
	results := make(chan addResult, 3)
	hold := make(chan struct{})
	go func() {
		res, _ := l.add(lineCommit("dev", "dev-2"), hold)
		results <- res
	}()
	testsync.WaitFor(t, "the first patient commit to wait", 10*time.Second, func() bool { return l.waiting() == 1 })
	leaving := make(chan struct{})
	go func() {
		res, _ := l.add(lineCommit("dev", "dev-3"), leaving)
		results <- res
	}()
	testsync.WaitFor(t, "the second patient commit to wait", 10*time.Second, func() bool { return l.waiting() == 2 })
	if got := perSource(t, next, l.take(nil, 1, 1<<20)); got["dev"] != 1 {
		t.Fatalf("group: %v, want dev-0", got)
	}
	if res := <-results; res != lineAdded {
		t.Fatalf("the first patient commit: %v, want added once a place was free", res)
	}
	close(leaving)
	if res := <-results; res != lineGaveUp {
		t.Fatalf("the second patient commit, its hold closed: %v, want gave up", res)
	}
	if got := perSource(t, next, l.take(nil, 10, 1<<20)); got["dev"] != 2 {
		t.Errorf("group: %v, want dev-1 and dev-2 and not dev-3", got)
	}
	for _, key := range []string{"z1", "z2"} {
		if res, _ := l.add(lineCommit("dev", key), nil); res != lineAdded {
			t.Fatalf("add %s: %v", key, res)
		}
	}
	go func() {
		res, _ := l.add(lineCommit("dev", "y"), hold)
		results <- res
	}()
	testsync.WaitFor(t, "a patient commit to wait", 10*time.Second, func() bool { return l.waiting() == 1 })
	l.close()
	if res := <-results; res != lineClosed {
		t.Errorf("a patient commit when the line closed: %v, want closed", res)
	}
}

// waiting returns how many commits wait for a place.
func (l *waitLine) waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.waiters)
}

// TestWaitLinePushedOutPatientCommitWaitsAgain: a source below its fair
// share takes the place of another's newest commit; when that commit can
// wait, it is not refused but waits again, first in line, and is in the
// group after next; when the line closes first, it is committed with the
// rest.
func TestWaitLinePushedOutPatientCommitWaitsAgain(t *testing.T) {
	l := newWaitLine(2)
	next := map[string]int{}
	for i := range 2 {
		c := lineCommit("dev", fmt.Sprintf("dev-%d", i))
		c.patient = true
		if res, _ := l.add(c, make(chan struct{})); res != lineAdded {
			t.Fatalf("add dev-%d: %v", i, res)
		}
	}
	if res, pushed := l.add(lineCommit("hook", "hook-0"), nil); res != lineAdded || pushed != nil {
		t.Fatalf("the webhook's commit in a line the devices fill: %v, pushed %v; want let in, nothing refused", res, pushed)
	}
	if got := perSource(t, next, l.take(nil, 10, 1<<20)); got["dev"] != 1 || got["hook"] != 1 {
		t.Fatalf("group: %v, want dev-0 and hook-0", got)
	}
	if got := perSource(t, next, l.take(nil, 10, 1<<20)); got["dev"] != 1 {
		t.Fatalf("next group: %v, want dev-1 back from waiting", got)
	}
	for i := 2; i < 4; i++ {
		c := lineCommit("dev", fmt.Sprintf("dev-%d", i))
		c.patient = true
		if res, _ := l.add(c, make(chan struct{})); res != lineAdded {
			t.Fatalf("add dev-%d: %v", i, res)
		}
	}
	if res, pushed := l.add(lineCommit("hook", "hook-1"), nil); res != lineAdded || pushed != nil {
		t.Fatalf("add hook-1: %v, pushed %v", res, pushed)
	}
	l.close() // dev-3, pushed out by hook-1, waits again: it was let in, so it is committed
	if got := perSource(t, next, l.take(nil, 10, 1<<20)); got["dev"] != 2 || got["hook"] != 1 {
		t.Errorf("after close: %v, want dev-2, dev-3 and hook-1 committed", got)
	}
}
