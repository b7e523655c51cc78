package sources

import (
	"math/big"
	"strings"
	"testing"
)

func TestCompareCursor(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		// Numbers compare by value.
		{"9", "10", -1},
		{"10", "9", 1},
		{"10", "10", 0},
		{"007", "7", 0},
		{"-1", "1", -1},
		{"-10", "-9", -1},
		{"-0", "0", 0},
		{"0.0", "-0e5", 0},
		{"+5", "5", 0},
		{"1.5", "1.25", 1},
		{"1.50", "1.5", 0},
		{"0.001", "0.01", -1},
		{"1e3", "1000", 0},
		{"1E+3", "999.999", 1},
		{"12e-1", "1.2", 0},
		{"-1e3", "-999", -1},
		{"18446744073709551616", "18446744073709551615", 1}, // beyond uint64
		{"123456789012345678901234567890", "123456789012345678901234567891", -1},
		{"1e999999999999999999999", "1e999999999999999999998", 1}, // exponents beyond int64
		{"1e-999999999999999999999", "0", 1},
		{"-1e999999999999999999999", "1", -1},
		{"0.000000000000000000001", "1e-21", 0},
		// Timestamps compare as instants.
		{"2024-05-01T10:00:00Z", "2024-05-01T09:59:59Z", 1},
		{"2024-05-01T11:30:00+02:00", "2024-05-01T10:00:00Z", -1}, // 09:30Z
		{"2024-05-01T12:00:00+02:00", "2024-05-01T10:00:00Z", 0},
		{"2024-05-01T10:00:00.5Z", "2024-05-01T10:00:00.123456789Z", 1},
		{"2024-05-01T10:00:00Z", "2024-05-01T10:00:00.000000001Z", -1},
		// Anything else, or a mix, compares as strings.
		{"abc", "abd", -1},
		{"b", "a", 1},
		{"", "", 0},
		{"", "0", -1},
		{"9", "10a", 1},
		{"1.", "1", 1},
		{".5", "0.4", -1},
		{"1e", "1", 1},
		{"NaN", "1", 1},
		{"2024-05-01T10:00:00Z", "9", -1},
		{"2024-05-01", "2024-05-02", -1},
		{"2024-13-01T10:00:00Z", "2024-02-01T10:00:00Z", 1},
	}
	for _, tt := range tests {
		if got := CompareCursor(tt.a, tt.b); got != tt.want {
			t.Errorf("CompareCursor(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := CompareCursor(tt.b, tt.a); got != -tt.want {
			t.Errorf("CompareCursor(%q, %q) = %d, want %d", tt.b, tt.a, got, -tt.want)
		}
	}
}

func BenchmarkCompareCursor(b *testing.B) {
	for b.Loop() {
		if CompareCursor("1714557600123", "1714557600124") != -1 {
			b.Fatal("wrong order")
		}
	}
}

// FuzzCompareCursor checks that CompareCursor is an antisymmetric
// comparison and that numbers compare as exact rationals do.
func FuzzCompareCursor(f *testing.F) {
	for _, s := range [][2]string{{"9", "10"}, {"-1.5e3", "-1500"}, {"0.1", "1e-1"}, {"007", "7.0"},
		{"2024-05-01T10:00:00Z", "2024-05-01T12:00:00+02:00"}, {"abc", "1"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ab, ba := CompareCursor(a, b), CompareCursor(b, a)
		if ab != -ba || ab < -1 || ab > 1 {
			t.Fatalf("CompareCursor(%q, %q) = %d but reversed = %d", a, b, ab, ba)
		}
		if CompareCursor(a, a) != 0 {
			t.Fatalf("CompareCursor(%q, itself) != 0", a)
		}
		ra, oka := smallRat(a)
		rb, okb := smallRat(b)
		if oka && okb {
			if want := ra.Cmp(rb); ab != want {
				t.Fatalf("CompareCursor(%q, %q) = %d, big.Rat says %d", a, b, ab, want)
			}
		}
	})
}

// smallRat parses a decimal with a small exponent exactly.
func smallRat(s string) (*big.Rat, bool) {
	d, ok := parseDecimal(s)
	if !ok || d.bigExp != nil || d.exp > 400 || d.exp < -400 || strings.HasPrefix(s, "+") {
		return nil, false
	}
	return new(big.Rat).SetString(s)
}
