package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// keys builds a cluster's etcd keys.
type keys struct{ cluster string }

func (k keys) prefix() string              { return "/ingestor/" + k.cluster + "/" }
func (k keys) members() string             { return k.prefix() + "members/" }
func (k keys) member(name string) string   { return k.members() + name }
func (k keys) owner(source string) string  { return k.prefix() + "sources/" + source + "/owner" }
func (k keys) cursor(source string) string { return k.prefix() + "sources/" + source + "/cursor" }
func (k keys) seats() string               { return k.prefix() + "seats/" }
func (k keys) seat(name string) string     { return k.seats() + name }
func (k keys) compactor() string           { return k.prefix() + "compactor" }

// ErrNotOwner is returned by a checkpoint or release of an ownership the
// member no longer holds: its lease was lost, or the key was taken away.
var ErrNotOwner = errors.New("not the owner of the source any more")

// Ownership is a member's hold on one source: its ownership key, created
// under the member's lease at revision rev.
type Ownership struct {
	m      *Member
	source string
	rev    int64
}

// Acquire takes source's ownership key for m when no one holds it. It
// returns the ownership, or nil and the member that holds it.
func (m *Member) Acquire(ctx context.Context, source string) (*Ownership, string, error) {
	if !m.Valid() {
		return nil, "", fmt.Errorf("cluster: acquire %q: %w: the lease is not valid", source, ErrNotOwner)
	}
	key := m.keys.owner(source)
	r, err := m.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, m.name, clientv3.WithLease(m.lease))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return nil, "", fmt.Errorf("cluster: acquire %q: %w", source, err)
	}
	if !r.Succeeded {
		holder := ""
		if kvs := r.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			holder = string(kvs[0].Value)
		}
		return nil, holder, nil
	}
	return &Ownership{m: m, source: source, rev: r.Header.Revision}, "", nil
}

// Source returns the source owned.
func (o *Ownership) Source() string { return o.source }

// Valid reports whether the member may still act as the source's owner:
// its lease is valid as it sees it. A member polls only while Valid, and
// ends a poll by Deadline.
func (o *Ownership) Valid() bool { return o.m.Valid() }

// Deadline is the member's Deadline.
func (o *Ownership) Deadline() time.Time { return o.m.Deadline() }

// held is the condition of every write on behalf of o: the ownership key
// is the one o created, still naming this member.
func (o *Ownership) held() []clientv3.Cmp {
	key := o.m.keys.owner(o.source)
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(key), "=", o.rev),
		clientv3.Compare(clientv3.Value(key), "=", o.m.name),
	}
}

// Checkpoint writes cursor as the source's checkpoint, only while o's key
// is held; ErrNotOwner otherwise.
func (o *Ownership) Checkpoint(ctx context.Context, cursor string) error {
	r, err := o.m.client.Txn(ctx).If(o.held()...).Then(clientv3.OpPut(o.m.keys.cursor(o.source), cursor)).Commit()
	if err != nil {
		return fmt.Errorf("cluster: checkpoint %q: %w", o.source, err)
	}
	if !r.Succeeded {
		return fmt.Errorf("cluster: checkpoint %q: %w", o.source, ErrNotOwner)
	}
	return nil
}

// Release deletes o's key, and with it writes cursor as the final
// checkpoint when cursor is not empty, in one transaction: the next owner
// starts exactly where o stopped. ErrNotOwner when the key is gone.
func (o *Ownership) Release(ctx context.Context, cursor string) error {
	ops := []clientv3.Op{clientv3.OpDelete(o.m.keys.owner(o.source))}
	if cursor != "" {
		ops = append(ops, clientv3.OpPut(o.m.keys.cursor(o.source), cursor))
	}
	r, err := o.m.client.Txn(ctx).If(o.held()...).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("cluster: release %q: %w", o.source, err)
	}
	if !r.Succeeded {
		return fmt.Errorf("cluster: release %q: %w", o.source, ErrNotOwner)
	}
	return nil
}

// Checkpointed returns source's cursor checkpoint, if one was written.
func (m *Member) Checkpointed(ctx context.Context, source string) (string, bool, error) {
	r, err := m.client.Get(ctx, m.keys.cursor(source))
	if err != nil {
		return "", false, fmt.Errorf("cluster: read the checkpoint of %q: %w", source, err)
	}
	if len(r.Kvs) == 0 {
		return "", false, nil
	}
	return string(r.Kvs[0].Value), true, nil
}

// Members returns the names of the live members (those whose member key
// exists) and the etcd revision they were read at.
func (m *Member) Members(ctx context.Context) ([]string, int64, error) {
	r, err := m.client.Get(ctx, m.keys.members(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, 0, fmt.Errorf("cluster: list members: %w", err)
	}
	names := make([]string, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		names = append(names, strings.TrimPrefix(string(kv.Key), m.keys.members()))
	}
	return names, r.Header.Revision, nil
}

// Seats returns the names of the members that have a seat (see
// Options.RebalanceDelay): live ones, and those away for less than the
// delay.
func (m *Member) Seats(ctx context.Context) ([]string, error) {
	r, err := m.client.Get(ctx, m.keys.seats(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("cluster: list seats: %w", err)
	}
	names := make([]string, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		names = append(names, strings.TrimPrefix(string(kv.Key), m.keys.seats()))
	}
	return names, nil
}

// WatchSeats reports every change to the seat keys, as WatchMembers.
func (m *Member) WatchSeats(ctx context.Context) clientv3.WatchChan {
	return m.client.Watch(clientv3.WithRequireLeader(ctx), m.keys.seats(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
}

// WatchMembers reports every change to the member keys (joins, leaves,
// expiries) from now on, until ctx ends. A reader lists them again with
// Members; the channel closes when the watch fails (etcd down) or ctx
// ends.
func (m *Member) WatchMembers(ctx context.Context) clientv3.WatchChan {
	return m.client.Watch(clientv3.WithRequireLeader(ctx), m.keys.members(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
}

// Write is one source's part of a batched write (Member.WriteAll): its
// cursor as the new checkpoint (unless empty), and with Release its
// ownership key deleted as well.
type Write struct {
	O       *Ownership
	Cursor  string
	Release bool
}

// WriteAll applies writes in as few etcd transactions as etcd allows:
// each transaction holds up to maxTxnOps-2 writes (etcd's --max-txn-ops
// counts a nested transaction's own operations against what its parent
// leaves), each a nested transaction conditioned on its own ownership,
// so one source's lost hold does not refuse the others. It returns the
// sources refused (another member holds them), and those whose
// transaction failed with its error: their writes did not happen.
func (m *Member) WriteAll(ctx context.Context, writes []Write, maxTxnOps int) (refused, failed []string, err error) {
	per := max(1, maxTxnOps-2)
	var errs []error
	for start := 0; start < len(writes); start += per {
		batch := writes[start:min(start+per, len(writes))]
		ops := make([]clientv3.Op, 0, len(batch))
		for _, w := range batch {
			var then []clientv3.Op
			if w.Release {
				then = append(then, clientv3.OpDelete(m.keys.owner(w.O.source)))
			}
			if w.Cursor != "" {
				then = append(then, clientv3.OpPut(m.keys.cursor(w.O.source), w.Cursor))
			}
			if len(then) == 0 {
				continue
			}
			ops = append(ops, clientv3.OpTxn(w.O.held(), then, nil))
		}
		if len(ops) == 0 {
			continue
		}
		r, err := m.client.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster: write %d checkpoints: %w", len(ops), err))
			for _, w := range batch {
				failed = append(failed, w.O.source)
			}
			continue
		}
		i := 0
		for _, w := range batch {
			if !w.Release && w.Cursor == "" {
				continue
			}
			if !r.Responses[i].GetResponseTxn().GetSucceeded() {
				refused = append(refused, w.O.source)
			}
			i++
		}
	}
	return refused, failed, errors.Join(errs...)
}

// Taken is one source of AcquireAll: the ownership when m got it, with
// the source's checkpoint read in the same transaction; the member that
// holds it otherwise.
type Taken struct {
	Source       string
	O            *Ownership
	Cursor       string
	Checkpointed bool
	Holder       string
}

// AcquireAll takes the ownership keys of sources that no one holds, in
// as few transactions as etcd allows (as WriteAll), reading each taken
// source's checkpoint in the same transaction: two round trips for a
// whole member's sources instead of two per source.
func (m *Member) AcquireAll(ctx context.Context, sources []string, maxTxnOps int) ([]Taken, error) {
	if !m.Valid() {
		return nil, fmt.Errorf("cluster: acquire: %w: the lease is not valid", ErrNotOwner)
	}
	per := max(1, maxTxnOps-2)
	var out []Taken
	var errs []error
	for start := 0; start < len(sources); start += per {
		batch := sources[start:min(start+per, len(sources))]
		ops := make([]clientv3.Op, 0, len(batch))
		for _, src := range batch {
			key := m.keys.owner(src)
			ops = append(ops, clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
				[]clientv3.Op{clientv3.OpPut(key, m.name, clientv3.WithLease(m.lease)), clientv3.OpGet(m.keys.cursor(src))},
				[]clientv3.Op{clientv3.OpGet(key)}))
		}
		r, err := m.client.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster: acquire %d sources: %w", len(batch), err))
			continue
		}
		for i, src := range batch {
			sub := r.Responses[i].GetResponseTxn()
			t := Taken{Source: src}
			if sub.GetSucceeded() {
				t.O = &Ownership{m: m, source: src, rev: r.Header.Revision}
				if kvs := sub.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
					t.Cursor, t.Checkpointed = string(kvs[0].Value), true
				}
			} else if kvs := sub.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
				t.Holder = string(kvs[0].Value)
			}
			out = append(out, t)
		}
	}
	return out, errors.Join(errs...)
}
