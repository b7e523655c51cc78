package processor

import (
	"fmt"
	"testing"
)

func TestKeyCacheEvictsLeastRecentlyUsed(t *testing.T) {
	c := newKeyCache(2)
	c.add("s", "a")
	c.add("s", "b")
	if !c.has("s", "a") { // a is now the most recent
		t.Fatal("a missing")
	}
	c.add("s", "c") // evicts b
	if c.has("s", "b") || !c.has("s", "a") || !c.has("s", "c") {
		t.Errorf("after adding c: a=%v b=%v c=%v, want b evicted", c.has("s", "a"), c.has("s", "b"), c.has("s", "c"))
	}
}

// TestKeyCacheAllocatesNothingWhenFull checks that a full cache looks up
// and adds pairs without allocating: a worker asks it about every event.
func TestKeyCacheAllocatesNothingWhenFull(t *testing.T) {
	const size = 1000
	keys := make([]string, 3*size) // AllocsPerRun also runs once more
	for i := range keys {
		keys[i] = fmt.Sprintf("evt-%08d", i)
	}
	c := newKeyCache(size)
	for _, k := range keys[:size] {
		c.add("github", k)
	}
	i := 0
	allocs := testing.AllocsPerRun(size, func() {
		if c.has("github", keys[size+i]) {
			t.Fatalf("%s cached before it was added", keys[size+i])
		}
		c.add("github", keys[size+i]) // evicts keys[i]
		i++
	})
	if allocs != 0 {
		t.Errorf("%v allocations per lookup and add, want 0", allocs)
	}
	if c.has("github", keys[0]) || !c.has("github", keys[size+i-1]) {
		t.Error("the oldest pair was not evicted, or the newest is missing")
	}
}

// BenchmarkKeyCache measures a lookup that misses and the add that
// follows it in a full cache, as for each new event of a frame.
func BenchmarkKeyCache(b *testing.B) {
	const size = DefaultDedupeCacheSize
	keys := make([]string, 4*size)
	for i := range keys {
		keys[i] = fmt.Sprintf("evt-%08d", i)
	}
	c := newKeyCache(size)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := keys[i%len(keys)]
		if !c.has("github", k) {
			c.add("github", k)
		}
		i++
	}
}
