package cluster

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// names returns n names: prefix followed by 1..n, zero-padded to the
// same width (s01..s30), so that neighbours differ in one byte.
func names(prefix string, n int) []string {
	out := make([]string, n)
	width := len(fmt.Sprint(n))
	for i := range out {
		out[i] = fmt.Sprintf("%s%0*d", prefix, width, i+1)
	}
	return out
}

// loads returns how many sources placed puts on each of members, failing
// the test if it misses a source or uses another member.
func loads(t *testing.T, placed map[string]string, sources, members []string) map[string]int {
	t.Helper()
	out := make(map[string]int, len(members))
	for _, m := range members {
		out[m] = 0
	}
	for _, s := range sources {
		m, ok := placed[s]
		if _, member := out[m]; !ok || !member {
			t.Fatalf("source %q placed on %q, not on one of the %d members", s, m, len(members))
		}
	}
	for _, m := range placed {
		out[m]++
	}
	if n := len(slices.Compact(slices.Sorted(slices.Values(sources)))); len(placed) != n {
		t.Fatalf("placed %d sources, want %d", len(placed), n)
	}
	return out
}

// spread returns the fewest and most sources of any member.
func spread(l map[string]int) (lo, hi int) {
	return slices.Min(slices.Collect(maps.Values(l))), slices.Max(slices.Collect(maps.Values(l)))
}

// placeFair places sources on members and fails the test unless every
// member runs within 10% of the mean, or its floor or ceiling.
func placeFair(t *testing.T, sources, members []string) map[string]string {
	t.Helper()
	placed := PlaceAll(sources, members)
	n, m := len(sources), len(members)
	lo, hi := spread(loads(t, placed, sources, members))
	if (10*m*lo < 9*n && lo < n/m) || (10*m*hi > 11*n && hi > (n+m-1)/m) {
		t.Fatalf("%d sources on %d members: %d to %d each, not within 10%% of %.1f", n, m, lo, hi, float64(n)/float64(m))
	}
	return placed
}

// moved returns how many sources run on another member in after.
func moved(before, after map[string]string) int {
	n := 0
	for s, m := range before {
		if after[s] != m {
			n++
		}
	}
	return n
}

// TestPlaceAllSpreadsWithinTenPercent: each member runs within 10% of the
// mean; the first choices alone gave 78 to 120 around 100.
func TestPlaceAllSpreadsWithinTenPercent(t *testing.T) {
	for _, c := range []struct{ sources, members int }{{10000, 20}, {10000, 100}, {1000, 7}} {
		sources, members := names("s", c.sources), names("m", c.members)
		lo, hi := spread(loads(t, placeFair(t, sources, members), sources, members))
		t.Logf("%d sources on %d members: %d to %d each", c.sources, c.members, lo, hi)
	}
}

// TestPlaceAllSmallSetsGetFloorOrCeiling: with few sources each member
// runs the floor or the ceiling of the mean, names differing in one byte
// included (the first choices gave 9, 8 and 13 of 30 sources).
func TestPlaceAllSmallSetsGetFloorOrCeiling(t *testing.T) {
	for _, c := range []struct{ sources, members int }{{30, 3}, {30, 4}, {7, 3}, {3, 5}, {30, 1}} {
		sources, members := names("s", c.sources), names("m", c.members)
		l := loads(t, PlaceAll(sources, members), sources, members)
		floor, ceil := c.sources/c.members, (c.sources+c.members-1)/c.members
		if lo, hi := spread(l); lo < floor || hi > ceil {
			t.Errorf("%d sources on %d members: %v, want %d to %d each", c.sources, c.members, l, floor, ceil)
		}
	}
}

// TestPlaceAllMovesLittle: a member joining takes about its share and a
// member leaving gives up about its own, moving at most 1.5 times the
// ideal. The members held at a bound follow it as the mean moves, whatever
// they gain or lose, so with 100 sources a member some leaves move more:
// of the 100 members leaving 10,000 sources one at a time, the median
// moved 1.40 times its own and the worst 1.54. So each leaver may move up
// to 1.6 times its own, and the five leaving here at most 1.5 times
// theirs together.
func TestPlaceAllMovesLittle(t *testing.T) {
	for _, c := range []struct{ sources, members int }{{10000, 20}, {10000, 100}, {30, 3}} {
		sources, all := names("s", c.sources), names("m", c.members+1)
		members := all[:c.members]
		before := placeFair(t, sources, members)

		joined := placeFair(t, sources, all)
		ideal := float64(c.sources) / float64(c.members+1)
		n := moved(before, joined)
		t.Logf("%d sources, %s joins %d members: %d move, %.2f times the ideal %.1f",
			c.sources, all[c.members], c.members, n, float64(n)/ideal, ideal)
		if float64(n) > 1.5*ideal {
			t.Errorf("%d sources, %s joining %d members moved %d, over 1.5 times the ideal %.1f",
				c.sources, all[c.members], c.members, n, ideal)
		}

		owned, others := 0, 0
		for _, leaver := range members[:min(5, len(members))] {
			own, between := leave(t, sources, members, before, leaver)
			owned, others = owned+own, others+between
			t.Logf("%d sources, %s leaves %d members: %d of its own and %d others move, %.2f times the ideal",
				c.sources, leaver, c.members, own, between, float64(own+between)/float64(own))
			if 10*between > 6*own {
				t.Errorf("%d sources, %s leaving %d members moved %d between members that stay, over 0.6 times its own %d",
					c.sources, leaver, c.members, between, own)
			}
		}
		if 2*others > owned {
			t.Errorf("%d sources, members leaving %d one at a time moved %d between members that stay, over half their own %d",
				c.sources, c.members, others, owned)
		}
	}
}

// leave places sources on members without leaver and returns how many of
// the leaver's sources and of the others' move from before.
func leave(t *testing.T, sources, members []string, before map[string]string, leaver string) (own, others int) {
	t.Helper()
	stay := slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == leaver })
	after := placeFair(t, sources, stay)
	for s, m := range before {
		switch {
		case m == leaver:
			own++
		case after[s] != m:
			others++
		}
	}
	return own, others
}

// TestPlaceAllIsDeterministic: the order of the names and duplicates do not
// change the placement, and a fixed set places the same on every machine
// and in every version (a rolling upgrade runs two versions side by side).
func TestPlaceAllIsDeterministic(t *testing.T) {
	sources, members := names("feed-", 1000), names("node-", 7)
	want := placeFair(t, sources, members)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5 {
		s := append(slices.Clone(sources), sources[:100]...)
		m := append(slices.Clone(members), members[0])
		rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
		rng.Shuffle(len(m), func(i, j int) { m[i], m[j] = m[j], m[i] })
		if got := PlaceAll(s, m); !maps.Equal(got, want) {
			t.Fatalf("shuffled, with duplicates: %d sources placed elsewhere", moved(want, got))
		}
	}

	placed := PlaceAll(names("s", 30), []string{"m1", "m2", "m3"})
	var got strings.Builder
	for _, s := range names("s", 30) {
		got.WriteString(strings.TrimPrefix(placed[s], "m"))
	}
	if want := "321132222213121231131233311323"; got.String() != want {
		t.Errorf("s01..s30 on m1, m2, m3: members %s, want %s", got.String(), want)
	}
}

// TestPlaceAllIsTheBestWithinBounds compares small placements with every
// assignment: none within the bounds has a higher total score.
func TestPlaceAllIsTheBestWithinBounds(t *testing.T) {
	for _, c := range []struct{ sources, members int }{{6, 2}, {7, 3}, {8, 3}, {8, 4}, {9, 4}} {
		for _, prefix := range []string{"s", "feed-", "x"} {
			sources, members := names(prefix, c.sources), names("m", c.members)
			placed := PlaceAll(sources, members)
			lo, hi := loadBounds(c.sources, c.members)
			l := loads(t, placed, sources, members)
			if least, most := spread(l); least < lo || most > hi {
				t.Fatalf("%v on %v: %v, want %d to %d each", sources, members, l, lo, hi)
			}
			if got, best := total(placed), bestTotal(sources, members, lo, hi); got != best {
				t.Errorf("%v on %v: total score %d, the best within bounds is %d", sources, members, got, best)
			}
		}
	}
}

// total returns the sum of the pair scores of placed.
func total(placed map[string]string) int64 {
	var sum int64
	for s, m := range placed {
		sum += pairScore(hashNames([]string{m})[0].hash, hashNames([]string{s})[0].hash)
	}
	return sum
}

// bestTotal tries every assignment of sources to members and returns the
// highest total score of those giving each member lo to hi sources.
func bestTotal(sources, members []string, lo, hi int) int64 {
	ss, ms := hashNames(sources), hashNames(members)
	best := int64(-1)
	count := make([]int, len(ms))
	var try func(i int, sum int64)
	try = func(i int, sum int64) {
		if i == len(ss) {
			if slices.Min(count) >= lo {
				best = max(best, sum)
			}
			return
		}
		for m := range ms {
			if count[m] < hi {
				count[m]++
				try(i+1, sum+pairScore(ms[m].hash, ss[i].hash))
				count[m]--
			}
		}
	}
	try(0, 0)
	return best
}

// TestPlaceAllNamesDifferingInOneByte: member and source names that differ
// in their last byte still get unrelated scores, so the first choices
// spread evenly before any bound applies.
func TestPlaceAllNamesDifferingInOneByte(t *testing.T) {
	sources, members := hashNames(names("s", 9000)), hashNames(names("m", 9))
	first := make([]int, len(members))
	for _, s := range sources {
		best := 0
		for b, m := range members {
			if pairScore(m.hash, s.hash) > pairScore(members[best].hash, s.hash) {
				best = b
			}
		}
		first[best]++
	}
	// 1000 each on average, a standard deviation of 30.
	if lo, hi := slices.Min(first), slices.Max(first); lo < 880 || hi > 1120 {
		t.Errorf("first choices of s0001..s9000 on m1..m9: %v, not within four deviations of 1000", first)
	}
	sources2, members2 := names("s", 30), []string{"m1", "m2", "m3"}
	if l := loads(t, PlaceAll(sources2, members2), sources2, members2); l["m1"] != 10 || l["m2"] != 10 || l["m3"] != 10 {
		t.Errorf("s01..s30 on m1, m2, m3: %v, want 10 each", l)
	}
}

// TestPlaceAllEmpty: no members or no sources place nothing; one member
// runs everything.
func TestPlaceAllEmpty(t *testing.T) {
	if p := PlaceAll([]string{"a"}, nil); p == nil || len(p) != 0 {
		t.Errorf("no members: %v, want an empty map", p)
	}
	if p := PlaceAll(nil, []string{"m1"}); p == nil || len(p) != 0 {
		t.Errorf("no sources: %v, want an empty map", p)
	}
	if p := PlaceAll([]string{"a", "b", "a"}, []string{"m1", "m1"}); !maps.Equal(p, map[string]string{"a": "m1", "b": "m1"}) {
		t.Errorf("one member: %v, want it to run both sources", p)
	}
}

// BenchmarkPlaceAll places 10,000 sources on 100 members.
func BenchmarkPlaceAll(b *testing.B) {
	sources, members := names("s", 10000), names("m", 100)
	for b.Loop() {
		PlaceAll(sources, members)
	}
}
