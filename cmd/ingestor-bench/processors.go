package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/ingestorhq/ingestor/processor"
)

// processors are the in-process processor clients.
type processors struct {
	log           *slog.Logger
	endpoint, ack string

	clients []*processor.Client
	bytes   atomic.Int64
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	errs    []error
}

// start starts n clients, each running on its own goroutine until stop. They
// ack every event after reading its bytes.
func (p *processors) start(n int) error {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	handle := func(_ context.Context, ev *processor.Event) error {
		p.bytes.Add(int64(len(ev.Data())))
		return nil
	}
	for i := range n {
		c, err := processor.New(processor.Options{Endpoint: p.endpoint, AckEndpoint: p.ack, Logger: p.log.With("processor", i+1)})
		if err != nil {
			return err
		}
		p.clients = append(p.clients, c)
		p.wg.Go(func() {
			if err := c.Run(ctx, handle); err != nil {
				p.mu.Lock()
				p.errs = append(p.errs, fmt.Errorf("processor %d: %w", i+1, err))
				p.mu.Unlock()
			}
		})
	}
	return nil
}

// stop stops the clients and returns their errors. It may be called again.
func (p *processors) stop() error {
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	err := errors.Join(p.errs...)
	p.errs = nil
	return err
}

// totals sums the clients' counters.
func (p *processors) totals() processorTotals {
	t := processorTotals{Bytes: p.bytes.Load()}
	for _, c := range p.clients {
		st := c.Stats()
		t.Events += st.Events
		t.Frames += st.Frames
		t.Redeliveries += st.Redeliveries
	}
	return t
}
