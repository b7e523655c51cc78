package wire

import "time"

// parseTime parses the raw text of a JSON string as time.Time.UnmarshalJSON
// does: RFC 3339, escapes not resolved. The daemon's own format,
// UTC with a 'Z' and up to nine fraction digits, takes a fast path that
// gives the identical Time; anything else goes to UnmarshalText.
func parseTime(b []byte) (time.Time, error) {
	if t, ok := parseUTC(b); ok {
		return t, nil
	}
	var t time.Time
	err := t.UnmarshalText(b)
	return t, err
}

// parseUTC parses "2006-01-02T15:04:05Z" with an optional fraction of one
// to nine digits after the seconds, checking the ranges that
// time.Time.UnmarshalText checks. ok is false for anything else, valid or
// not.
func parseUTC(b []byte) (t time.Time, ok bool) {
	const n = len("2006-01-02T15:04:05")
	if len(b) < n+1 || len(b) > n+11 || b[len(b)-1] != 'Z' ||
		b[4] != '-' || b[7] != '-' || b[10] != 'T' || b[13] != ':' || b[16] != ':' {
		return time.Time{}, false
	}
	year, ok1 := digits(b[0:4])
	month, ok2 := digits(b[5:7])
	day, ok3 := digits(b[8:10])
	hour, ok4 := digits(b[11:13])
	minute, ok5 := digits(b[14:16])
	sec, ok6 := digits(b[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) ||
		month < 1 || month > 12 || day < 1 || day > daysIn(month, year) ||
		hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	nsec := 0
	if frac := b[n : len(b)-1]; len(frac) > 0 {
		if len(frac) < 2 || frac[0] != '.' {
			return time.Time{}, false
		}
		f, ok := digits(frac[1:])
		if !ok {
			return time.Time{}, false
		}
		for k := len(frac) - 1; k < 9; k++ {
			f *= 10
		}
		nsec = f
	}
	unix := daysSinceEpoch(year, month, day)*86400 + int64(hour*3600+minute*60+sec)
	return time.Unix(unix, int64(nsec)).UTC(), true
}

// digits parses a string of decimal digits, at most nine.
func digits(b []byte) (int, bool) {
	n := 0
	for _, c := range b {
		if c-'0' > 9 {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// daysIn returns the number of days in a month of the proleptic Gregorian
// calendar.
func daysIn(month, year int) int {
	if month == 2 && year%4 == 0 && (year%100 != 0 || year%400 == 0) {
		return 29
	}
	return monthDays[month]
}

var monthDays = [13]int{0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}

// daysSinceEpoch returns the number of days from 1970-01-01 to a date of
// the proleptic Gregorian calendar. It is Howard Hinnant's days_from_civil:
// years are counted from March, so that the leap day ends them, and
// 400-year eras repeat exactly.
func daysSinceEpoch(year, month, day int) int64 {
	if month <= 2 {
		year--
	}
	era := year / 400
	if year < 0 {
		era = (year - 399) / 400
	}
	yoe := year - era*400                     // [0, 399]
	doy := (153*((month+9)%12)+2)/5 + day - 1 // [0, 365]
	doe := yoe*365 + yoe/4 - yoe/100 + doy    // [0, 146096]
	return int64(era)*146097 + int64(doe) - 719468
}
