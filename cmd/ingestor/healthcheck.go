package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// cmdHealthcheck asks the daemon's ops listener (daemon.http_addr) for
// /healthz, for a container HEALTHCHECK in an image without curl. It exits
// 0 on 200, 1 on any other answer or none, and 2 on bad arguments.
func cmdHealthcheck(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:9464", "host:port of the daemon's http_addr")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ingestor healthcheck: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if _, _, err := net.SplitHostPort(*addr); err != nil {
		fmt.Fprintf(stderr, "ingestor healthcheck: -addr %q must be host:port, such as 127.0.0.1:9464\n", *addr)
		return 2
	}
	url := "http://" + *addr + "/healthz"
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintf(stderr, "ingestor healthcheck: GET %s: %v\n", url, err)
		return 2
	}
	// No proxy: a container's HTTP_PROXY must not stand between the check
	// and the daemon it checks.
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "ingestor healthcheck: GET %s: %v\n", url, err)
		return 1
	}
	_, readErr := io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if err := resp.Body.Close(); err != nil && readErr == nil {
		readErr = err
	}
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "ingestor healthcheck: GET %s: %s\n", url, resp.Status)
		return 1
	}
	if readErr != nil {
		fmt.Fprintf(stderr, "ingestor healthcheck: GET %s: read the answer: %v\n", url, readErr)
		return 1
	}
	return 0
}
