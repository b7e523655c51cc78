package actors

import "testing"

func TestMalformedPages(t *testing.T) {
	var m malformedPages
	// Two retries allowed: the third malformed answer in a row is dead-lettered.
	for i, want := range []bool{false, false, true, false} {
		if attempt, dead := m.malformed("c1", 2); dead != want {
			t.Fatalf("answer %d (attempt %d): dead-letter %v, want %v", i+1, attempt, dead, want)
		}
	}
	// A good answer before the dead letter is listed resolves it once
	// listed, not before.
	if m.succeeded("c1") {
		t.Fatal("resolved before the dead letter was listed")
	}
	if !m.listed("c1") {
		t.Fatal("not resolved once listed after a good answer")
	}
	if m.listed("c1") || m.succeeded("c1") {
		t.Fatal("resolved twice")
	}
	// A good answer resets the streak; 0 retries dead-letters at once.
	if _, dead := m.malformed("c2", 1); dead {
		t.Fatal("first malformed answer dead-lettered with 1 retry")
	}
	m.succeeded("c2")
	if _, dead := m.malformed("c2", 1); dead {
		t.Fatal("the streak was not reset by a good answer")
	}
	if _, dead := m.malformed("c3", 0); !dead {
		t.Fatal("0 retries did not dead-letter at once")
	}
	// Listed first, then the good answer: resolved then.
	if m.listed("c3") {
		t.Fatal("resolved with no good answer")
	}
	if !m.succeeded("c3") {
		t.Fatal("not resolved by a good answer after the listing")
	}
}
