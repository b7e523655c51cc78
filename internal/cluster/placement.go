package cluster

import (
	"crypto/sha256"
	"encoding/binary"
)

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

// score hashes member and source with SHA-256: names that differ in one
// byte (m1, m2, m3; s01, s02) must still spread evenly, which short
// non-cryptographic hashes of such names did not (one of three members
// got 4 of 30 sources).
func score(member, source string) uint64 {
	h := sha256.New()
	h.Write([]byte(member))
	h.Write([]byte{0})
	h.Write([]byte(source))
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}
