package pagebuf

import "testing"

// TestPageIsRecycledAfterEveryHold: the buffer goes back to the pool only
// once the fetch's hold and every frame's hold are let go, a frame's hold
// counts once however often it is released, and a kept page never goes
// back.
func TestPageIsRecycledAfterEveryHold(t *testing.T) {
	var p Pool
	buf := append(p.Get(100), make([]byte, 100)...)
	pg := p.NewPage(buf)
	a, b := pg.Hold(), pg.Hold()
	before := Recycled()
	pg.Release()
	a.Release()
	a.Release() // a second release of one hold changes nothing
	if Recycled() != before {
		t.Fatal("recycled while a frame still holds the page")
	}
	if !a.Released() || b.Released() {
		t.Fatalf("Released: %v %v, want true false", a.Released(), b.Released())
	}
	b.Release()
	if Recycled() != before+1 {
		t.Fatalf("recycled %d buffers, want 1", Recycled()-before)
	}

	kept := p.NewPage(make([]byte, 0, 100))
	kept.Keep()
	kept.Hold().Release()
	kept.Release()
	if Recycled() != before+1 {
		t.Fatal("a kept page was recycled")
	}

	var none *Page // a body not read into a pooled buffer
	none.Keep()
	none.Release()
	if h := none.Hold(); h != nil || h.Released() {
		t.Fatal("a nil page gave a hold")
	}
}

// TestGetReusesOnlyAFittingBuffer: a recycled buffer is reused for a body
// that fits it with at most a quarter to spare, not for a larger or a much
// smaller one; Get always returns an empty buffer of the capacity asked.
func TestGetReusesOnlyAFittingBuffer(t *testing.T) {
	for _, tt := range []struct {
		c, n int
		want bool
	}{
		{1000, 1000, true},
		{1000, 900, true},
		{1000, 800, true},
		{1000, 799, false},
		{1000, 1001, false},
		{1000, 500, false},
	} {
		if got := fits(tt.c, tt.n); got != tt.want {
			t.Errorf("fits(%d, %d) = %v, want %v", tt.c, tt.n, got, tt.want)
		}
	}
	var p Pool
	for _, n := range []int{1000, 900, 1001, 10} {
		p.NewPage(make([]byte, 1000)).Release()
		if got := p.Get(n); len(got) != 0 || cap(got) < n {
			t.Errorf("Get(%d): len %d cap %d", n, len(got), cap(got))
		}
	}
}
