package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// soakPush drives the push sources of the soak: webhook senders and
// devices, each at a steady pace, and counts what the daemon stored.
type soakPush struct {
	addr string // the push listener, host:port

	hooksStored   atomic.Int64 // webhook events answered 202 (each a new key)
	devicesStored atomic.Int64 // device envelopes answered "stored" (each a new event_id)
	refusals      atomic.Int64 // 429/503 and "retry" answers, resent
	errs          chan error
}

// run starts senders webhook senders and devices devices, each sending
// perSecond events a second until ctx ends; the returned function waits
// for them to finish what they started.
func (p *soakPush) run(ctx context.Context, senders, devices int, perSecond float64) func() error {
	p.errs = make(chan error, senders+devices)
	var wg sync.WaitGroup
	for i := range senders {
		wg.Go(func() { p.errs <- p.hookSender(ctx, i, perSecond) })
	}
	for i := range devices {
		wg.Go(func() { p.errs <- p.device(ctx, i, perSecond) })
	}
	return func() error {
		wg.Wait()
		close(p.errs)
		var errs []error
		for err := range p.errs {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
}

// pace calls send once per 1/perSecond until ctx ends.
func pace(ctx context.Context, perSecond float64, send func(n int) error) error {
	t := time.NewTicker(time.Duration(float64(time.Second) / perSecond))
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := send(n); err != nil {
			return err
		}
	}
}

// hookSender posts event n as {"id":"hI-n"} until it is stored, honouring
// Retry-After on 429 and 503.
func (p *soakPush) hookSender(ctx context.Context, i int, perSecond float64) error {
	client := &http.Client{Timeout: time.Minute}
	url := "http://" + p.addr + "/ingest/hooks"
	return pace(ctx, perSecond, func(n int) error {
		body := fmt.Appendf(nil, `{"id":"h%d-%d","kind":"order.created","amount":%d}`, i, n, n%1000)
		if err := p.post(ctx, client, url, body, http.StatusAccepted); err != nil {
			return fmt.Errorf("webhook sender %d: %w", i, err)
		}
		p.hooksStored.Add(1)
		if n%5 == 0 { // sent again, as after a lost answer: 200, stored once
			if err := p.post(ctx, client, url, body, http.StatusOK); err != nil {
				return fmt.Errorf("webhook sender %d: %w", i, err)
			}
		}
		return nil
	})
}

// post sends body to url until it is answered want, honouring Retry-After
// on 429 and 503.
func (p *soakPush) post(ctx context.Context, client *http.Client, url string, body []byte, want int) error {
	for {
		// The last event is finished even after ctx ends: it may be stored.
		req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		switch resp.StatusCode {
		case want:
			return nil
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			p.refusals.Add(1)
			secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			time.Sleep(time.Duration(max(secs, 1)) * time.Second) // what a sender is told to do
		default:
			return fmt.Errorf("POST %s answered %d, want %d: %s", body, resp.StatusCode, want, answer)
		}
	}
}

// deviceReconnectEvery is how many envelopes a device sends on one
// connection before it closes it and dials again, so that connections
// come and go all run long.
const deviceReconnectEvery = 500

// device sends envelopes of device dI, one at a time, until ctx ends,
// reconnecting every deviceReconnectEvery envelopes. Every that many
// envelopes it also takes a new device id (dI.G, its seq from 1 again),
// as a fleet whose devices come and go: the ids it leaves are forgotten
// after the source's device_retention.
func (p *soakPush) device(ctx context.Context, i int, perSecond float64) error {
	url := "ws://" + p.addr + "/ingest/devices/ws"
	var c *websocket.Conn
	defer func() {
		if c != nil {
			_ = c.Close(websocket.StatusNormalClosure, "")
		}
	}()
	return pace(ctx, perSecond, func(n int) error {
		if c != nil && n%deviceReconnectEvery == 0 {
			_ = c.Close(websocket.StatusNormalClosure, "")
			c = nil
		}
		gen, seq := (n-1)/deviceReconnectEvery, (n-1)%deviceReconnectEvery+1
		env := fmt.Appendf(nil, `{"schema_version":1,"event_id":"d%d-%d","type":"flow","ts":%q,"session_id":"soak","device_id":"d%d.%d","seq":%d,"payload":{"l_min":%d}}`,
			i, n, time.Now().UTC().Format(time.RFC3339Nano), i, gen, seq, n%100)
		if err := p.deliver(ctx, &c, url, env, "stored"); err != nil {
			return fmt.Errorf("device %d: %w", i, err)
		}
		p.devicesStored.Add(1)
		var err error
		switch {
		case n%5 == 0: // sent again, as after a lost answer: stored once
			err = p.deliver(ctx, &c, url, env, "stored")
		case n%20 == 1: // an invalid envelope: rejected, stored nowhere
			err = p.deliver(ctx, &c, url, fmt.Appendf(nil, `{"event_id":"bad-d%d-%d","device_id":"d%d"}`, i, n, i), "rejected")
		}
		if err != nil {
			return fmt.Errorf("device %d: %w", i, err)
		}
		return nil
	})
}

// deliver sends env on *c (dialling url first if *c is nil) until it is
// answered want, resending after each "retry".
func (p *soakPush) deliver(ctx context.Context, c **websocket.Conn, url string, env []byte, want string) error {
	for {
		if *c == nil {
			var err error
			if *c, _, err = websocket.Dial(context.WithoutCancel(ctx), url, nil); err != nil {
				return err
			}
		}
		status, retry, err := p.sendEnvelope(ctx, *c, env)
		switch {
		case err != nil:
			return err
		case status == want:
			return nil
		case status != "retry":
			return fmt.Errorf("envelope %s answered %q, want %q", env, status, want)
		}
		p.refusals.Add(1)
		time.Sleep(retry)
	}
}

// sendEnvelope sends env and reads its answer: its status, and for
// "retry" the wait asked for.
func (p *soakPush) sendEnvelope(ctx context.Context, c *websocket.Conn, env []byte) (string, time.Duration, error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := c.Write(wctx, websocket.MessageText, env); err != nil {
		return "", 0, err
	}
	_, msg, err := c.Read(wctx)
	if err != nil {
		return "", 0, err
	}
	var a struct {
		Status       string `json:"status"`
		RetryAfterMs int64  `json:"retry_after_ms"`
	}
	if err := json.Unmarshal(msg, &a); err != nil {
		return "", 0, fmt.Errorf("answer %s: %w", msg, err)
	}
	return a.Status, time.Duration(max(a.RetryAfterMs, 1)) * time.Millisecond, nil
}
