package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
)

// maxKeyNumber bounds the numbers a keySet keeps as bits: a bitmap of
// 2^26 bits is 8 MiB. Larger numbers go to the map.
const maxKeyNumber = 1 << 26

// keySet is the set of distinct keys -count-out counts, kept small so that
// counting millions of keys barely moves the processor's memory: a key
// that ends in a decimal number without a leading zero, such as "ev-17",
// is one bit in a bitmap of its prefix ("ev-"); any other key is an entry
// in a map.
type keySet struct {
	bits  map[string][]uint64
	other map[string]struct{}
	n     int64
}

func newKeySet() *keySet {
	return &keySet{bits: make(map[string][]uint64), other: make(map[string]struct{})}
}

// add adds key and reports whether it was new.
func (s *keySet) add(key string) bool {
	i := len(key)
	for i > 0 && key[i-1] >= '0' && key[i-1] <= '9' {
		i--
	}
	digits := key[i:]
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || n >= maxKeyNumber || (digits[0] == '0' && len(digits) > 1) {
		if _, ok := s.other[key]; ok {
			return false
		}
		s.other[key] = struct{}{}
		s.n++
		return true
	}
	words := s.bits[key[:i]]
	w, bit := n/64, uint64(1)<<(n%64)
	if w >= uint64(len(words)) {
		words = append(words, make([]uint64, int(w)+1-len(words)+len(words)/2)...)
		s.bits[key[:i]] = words
	}
	if words[w]&bit != 0 {
		return false
	}
	words[w] |= bit
	s.n++
	return true
}

// counts is what -count-out writes when the processor stops.
type counts struct {
	// Events is the number of events handed to the handler, redeliveries
	// included.
	Events int64 `json:"events"`
	// DistinctKeys is the number of distinct (source, key) pairs among them.
	DistinctKeys int64 `json:"distinct_keys"`
	// Redeliveries is the number of frames received again.
	Redeliveries int64 `json:"redeliveries"`
}

// writeCounts writes c as JSON to path.
func writeCounts(path string, c counts) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("-count-out: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("-count-out: %w", err)
	}
	return nil
}
