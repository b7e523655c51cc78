package processor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ingestorhq/ingestor/processor"
)

// ExampleRun is a whole processor program: it prints the id of each new
// event until it is interrupted. It needs a running daemon, so it is only
// compiled.
func ExampleRun() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// seen stands in for a durable store with a unique index on
	// (source, key), the event's idempotency key: a redelivered event is
	// found there and acknowledged again without being processed twice.
	seen := make(map[[2]string]bool)
	handle := func(ctx context.Context, ev *processor.Event) error {
		id := [2]string{ev.Source, ev.Key}
		if seen[id] {
			return nil
		}
		var rec struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(ev.Data(), &rec); err != nil {
			// An event that can never succeed is recorded and acked;
			// returning the error would bring it back after every ack
			// timeout.
			log.Printf("skip %s/%s: %v", ev.Source, ev.Key, err)
			return nil
		}
		fmt.Println(ev.Source, ev.Key, rec.ID)
		seen[id] = true
		return nil
	}

	err := processor.Run(ctx, processor.Options{
		Endpoint:    "tcp://127.0.0.1:5557",
		AckEndpoint: "tcp://127.0.0.1:5558",
	}, handle)
	if err != nil {
		log.Fatal(err)
	}
}

// ExampleNew keeps the Client to read its counters when Run returns.
func ExampleNew() {
	c, err := processor.New(processor.Options{
		Endpoint:    "tcp://127.0.0.1:5557",
		AckEndpoint: "tcp://127.0.0.1:5558",
		Logger:      slog.New(slog.NewJSONHandler(os.Stderr, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = c.Run(ctx, func(ctx context.Context, ev *processor.Event) error {
		return nil // acknowledge everything
	})
	if err != nil {
		log.Fatal(err)
	}
	st := c.Stats()
	fmt.Printf("%d events in %d frames, %d acked, %d failed, %d frames redelivered\n",
		st.Events, st.Frames, st.Acked, st.Failed, st.Redeliveries)
}
