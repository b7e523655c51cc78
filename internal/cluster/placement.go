package cluster

import "hash/fnv"

// Place returns the member among members that should run source: the one
// with the highest rendezvous hash of (member, source), "" when members is
// empty. Every member computes the same answer from the same list; each
// gets about len(sources)/len(members) sources, and a member joining takes
// only sources that then go to it, a member leaving gives up only its own.
func Place(source string, members []string) string {
	best, bestScore := "", uint64(0)
	for _, m := range members {
		if s := score(m, source); best == "" || s > bestScore || s == bestScore && m < best {
			best, bestScore = m, s
		}
	}
	return best
}

// score hashes member and source (FNV-1a, then a 64-bit finalizer so that
// names differing in their last byte still spread evenly).
func score(member, source string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(member))
	h.Write([]byte{0})
	h.Write([]byte(source))
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
