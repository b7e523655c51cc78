package queue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// An append whose raw payload is still being written (AppendAfter).
//
// Its statements are applied while the payload is written and committed
// only once the write reports it durable: on the webhook path the group's
// inserts (~0.2 ms) and the hand-over to the writer no longer wait for the
// raw store's sync, which the group commit waited for in turn. Nothing is
// committed that references bytes not yet durable: the writer applies the
// gated appends last in its transaction, under a savepoint of their own,
// and before the COMMIT waits for each one's write (at most gateWait). A
// write that failed rolls the savepoint back: its append fails with the
// write's error and the group's other requests commit. A write still
// running after gateWait rolls back too, and its append is handed to the
// writer again once the write ends, so a slow raw disk never holds the
// other sources' commits for longer than that.

// gateWait bounds how long the writer waits, before its COMMIT, for the
// raw writes of the gated appends it applied.
const gateWait = 20 * time.Millisecond

// deferringGated, when set (by a test), is called when the writer rolls
// back a gated request whose write outlasted gateWait.
var deferringGated func()

// errDeferred marks, in commitGroup's errs, a gated request whose write
// outlasted gateWait: it is finished later (deferGated), not with the
// group.
var errDeferred = errors.New("raw write still running: applied again once it ends")

// AppendAfter is Append for a batch whose raw payload is still being
// written: it hands b to the writer at once and returns wait, which waits
// for the commit and returns what Append returns. The caller sends the raw
// write's outcome on written exactly once; b commits only if it is nil,
// and otherwise wait returns an error wrapping it.
func (q *Queue) AppendAfter(ctx context.Context, b Batch, written <-chan error) (wait func() ([]Frame, error), err error) {
	done := make(chan struct{})
	var frames []Frame
	var ferr error
	r := q.appendRequest(b, nil, func(f []Frame, e error) { frames, ferr = f, e; close(done) })
	r.gate = written
	if err := q.enqueue(ctx, r); err != nil {
		return nil, fmt.Errorf("append batch of %q: %w", b.Source, err)
	}
	return func() ([]Frame, error) {
		<-done
		return frames, ferr
	}, nil
}

// applyGated applies the gated requests of group after the others, under
// the savepoint gated, waits for their raw writes and keeps what it may
// commit: see the comment at the top of this file. errs holds each
// request's outcome, by its index in group; the error returned ends the
// transaction.
func (q *Queue) applyGated(tx *sql.Tx, group []*request, errs []error) error {
	if _, err := tx.Exec(`SAVEPOINT gated`); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	for i, r := range group {
		if r.gate != nil {
			var err error
			if errs[i], err = q.applyOne(tx, r); err != nil {
				return err
			}
		}
	}
	outcomes, all := waitGates(group)
	if !all {
		if _, err := tx.Exec(`ROLLBACK TO gated`); err != nil {
			return fmt.Errorf("rollback to savepoint: %w", err)
		}
	}
	if _, err := tx.Exec(`RELEASE gated`); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	if all {
		return nil
	}
	for i, r := range group {
		if r.gate == nil {
			continue
		}
		switch o := outcomes[i]; {
		case !o.done:
			errs[i] = errDeferred
			if deferringGated != nil {
				deferringGated()
			}
			go q.deferGated(r)
		case o.err != nil:
			errs[i] = fmt.Errorf("raw write: %w", o.err)
		default:
			var err error
			if errs[i], err = q.applyOne(tx, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// gateOutcome is what a gated request's write reported, if it did.
type gateOutcome struct {
	done bool
	err  error
}

// waitGates waits up to gateWait for the writes of group's gated requests
// and returns their outcomes, by index in group, and whether every one
// wrote.
func waitGates(group []*request) ([]gateOutcome, bool) {
	timer := time.NewTimer(gateWait)
	defer timer.Stop()
	outcomes := make([]gateOutcome, len(group))
	all, expired := true, false
	for i, r := range group {
		if r.gate == nil {
			continue
		}
		o := &outcomes[i]
		if !expired {
			select {
			case o.err = <-r.gate:
				o.done = true
			case <-timer.C:
				expired = true
			}
		}
		if !o.done {
			select {
			case o.err = <-r.gate:
				o.done = true
			default:
			}
		}
		all = all && o.done && o.err == nil
	}
	return outcomes, all
}

// deferGated waits for the write of r, a gated request whose write
// outlasted gateWait, then hands it to the writer again, ungated, or
// fails it with the write's error.
func (q *Queue) deferGated(r *request) {
	if err := <-r.gate; err != nil {
		r.finished(fmt.Errorf("raw write: %w", err))
		return
	}
	again := &request{apply: r.apply, finished: r.finished, lazy: r.lazy}
	if err := q.enqueue(context.Background(), again); err != nil {
		r.finished(err)
	}
}
