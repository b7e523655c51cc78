package backoff

import (
	"testing"
	"time"
)

func TestCeilingGrowsAndCaps(t *testing.T) {
	p := Policy{Base: 100 * time.Millisecond, Max: 2 * time.Second}
	want := []time.Duration{100, 200, 400, 800, 1600, 2000, 2000}
	for n, w := range want {
		if got := p.Ceiling(n); got != w*time.Millisecond {
			t.Errorf("Ceiling(%d) = %v, want %v", n, got, w*time.Millisecond)
		}
	}
	if got := p.Ceiling(1000); got != 2*time.Second {
		t.Errorf("Ceiling(1000) = %v, want the cap", got)
	}
}

func TestDelayIsFullJitterWithinCeiling(t *testing.T) {
	p := Policy{Base: time.Second, Max: time.Minute}
	var low, high bool
	for i := 0; i < 2000; i++ {
		d := p.Delay(3)
		if d < 0 || d > 8*time.Second {
			t.Fatalf("Delay(3) = %v, outside [0, 8s]", d)
		}
		low = low || d < 2*time.Second
		high = high || d > 6*time.Second
	}
	if !low || !high {
		t.Errorf("2000 delays did not spread over the range (low=%v high=%v)", low, high)
	}
}

func TestJitterStaysInBand(t *testing.T) {
	for i := 0; i < 1000; i++ {
		d := Jitter(10*time.Second, 0.2)
		if d < 8*time.Second || d > 12*time.Second {
			t.Fatalf("Jitter = %v, outside 10s +/- 20%%", d)
		}
	}
	if d := Jitter(time.Second, 0); d != time.Second {
		t.Errorf("Jitter with 0 = %v", d)
	}
}
