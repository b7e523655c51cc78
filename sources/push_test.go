package sources

import (
	"strings"
	"testing"
)

func TestParseCIDR(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "192.30.252.0/22", want: "192.30.252.0/22"},
		{in: "2001:db8::/32", want: "2001:db8::/32"},
		{in: "203.0.113.7", want: "203.0.113.7/32"},
		{in: "::1", want: "::1/128"},
		{in: "::ffff:10.0.0.0/104", want: "10.0.0.0/8"},
		{in: "0.0.0.0/0", want: "0.0.0.0/0"},
		{in: "10.0.0.0/33", err: `"10.0.0.0/33" is not a CIDR`},
		{in: "2001:db8::1/32", err: `"2001:db8::1/32" has bits set past its /32: did you mean "2001:db8::/32"?`},
		{in: "::ffff:0:0/95", err: "has bits set past its /95"},
		{in: "fe80::1%eth0", err: "nor an address"},
		{in: "", err: "nor an address"},
	} {
		p, err := ParseCIDR(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseCIDR(%q) = %v, %v; want an error with %q", tc.in, p, err, tc.err)
		case tc.err == "" && (err != nil || p.String() != tc.want):
			t.Errorf("ParseCIDR(%q) = %v, %v; want %s", tc.in, p, err, tc.want)
		}
	}
}
