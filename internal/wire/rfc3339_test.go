package wire

import (
	"testing"
	"time"
)

// FuzzParseTime checks parseTime against time.Time.UnmarshalText, which
// encoding/json uses: the same errors, and the same Time, identical down
// to its representation when parseUTC took it.
func FuzzParseTime(f *testing.F) {
	for _, s := range []string{
		"2024-05-01T10:00:02.517Z", "2024-05-01T10:00:00Z", "1970-01-01T00:00:00Z",
		"0000-01-01T00:00:00Z", "0000-02-29T23:59:59.999999999Z", "9999-12-31T23:59:59.9Z",
		"2000-02-29T12:00:00Z", "1900-02-29T12:00:00Z", "2023-04-31T00:00:00Z",
		"2024-05-01T24:00:00Z", "2024-05-01T10:60:00Z", "2024-05-01T10:00:60Z",
		"2024-13-01T10:00:00Z", "2024-00-01T10:00:00Z", "2024-05-00T10:00:00Z",
		"2024-05-01T10:00:00.Z", "2024-05-01T10:00:00.1234567891Z", "2024-05-01T10:00:00,5Z",
		"2024-05-01T10:00:00z", "2024-05-01t10:00:00Z", "2024-05-01 10:00:00Z",
		"2024-05-01T10:00:00+02:00", "2024-05-01T10:00:00-00:00", "2024-05-01T10:00:00+24:00",
		"2024-5-01T10:00:00Z", "+2024-05-01T10:00:00Z", "2024-05-01T1:00:00Z", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseTime([]byte(s))
		var want time.Time
		wantErr := want.UnmarshalText([]byte(s))
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("parseTime(%q) error %v, UnmarshalText error %v", s, err, wantErr)
		}
		if err != nil {
			return
		}
		// A zone other than UTC is a new *time.Location on every parse.
		if !got.Equal(want) || got.String() != want.String() {
			t.Fatalf("parseTime(%q) = %v, UnmarshalText %v", s, got, want)
		}
		if fast, ok := parseUTC([]byte(s)); ok && fast != want {
			t.Fatalf("parseUTC(%q) = %#v, UnmarshalText %#v", s, fast, want)
		}
	})
}

// TestParseUTCEveryDay checks the fast path against UnmarshalText on every
// day of years around the calendar's edge cases.
func TestParseUTCEveryDay(t *testing.T) {
	for _, years := range [][2]int{{0, 4}, {99, 101}, {399, 401}, {1899, 1901}, {1969, 1972}, {1999, 2001}, {2099, 2101}, {9998, 9999}} {
		for d := time.Date(years[0], 1, 1, 23, 59, 59, 999999999, time.UTC); d.Year() <= years[1]; d = d.AddDate(0, 0, 1) {
			text := d.AppendFormat(nil, time.RFC3339Nano)
			got, ok := parseUTC(text)
			var want time.Time
			if err := want.UnmarshalText(text); err != nil {
				t.Fatalf("UnmarshalText(%s): %v", text, err)
			}
			if !ok || got != want {
				t.Fatalf("parseUTC(%s) = %v, %v; want %v", text, got, ok, want)
			}
		}
	}
}
