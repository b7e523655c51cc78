package edge

import (
	"net/http"
	"strings"
	"sync"
	"testing"
)

// BenchmarkHTTPAccept posts one event per request from 16 clients and
// reports accepted events per second (each answered after its commit).
func BenchmarkHTTPAccept(b *testing.B) {
	d := newFakeDaemon(b)
	o := testOptions(b, d)
	f := startForwarder(b, o)
	url := "http://" + f.HTTPAddr() + "/events"
	var next sync.WaitGroup
	work := make(chan struct{})
	b.ResetTimer()
	for range 16 {
		next.Add(1)
		go func() {
			defer next.Done()
			for range work {
				resp, err := http.Post(url, "application/json", strings.NewReader(`{"type":"t","payload":{"n":1}}`))
				if err != nil {
					b.Error(err)
					return
				}
				if err := resp.Body.Close(); err != nil || resp.StatusCode != 200 {
					b.Errorf("post: %d %v", resp.StatusCode, err)
				}
			}
		}()
	}
	for range b.N {
		work <- struct{}{}
	}
	close(work)
	next.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
