package processor

import "testing"

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
