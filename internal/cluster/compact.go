package cluster

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// HoldCompactor takes the cluster's compaction key under m's lease when
// no one holds it, and reports whether m holds it: one member at a time
// compacts etcd's history, and another takes over when it goes.
func (m *Member) HoldCompactor(ctx context.Context) (bool, error) {
	key := m.keys.compactor()
	r, err := m.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, m.name, clientv3.WithLease(m.lease))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return false, fmt.Errorf("cluster: take the compaction key: %w", err)
	}
	if r.Succeeded {
		return true, nil
	}
	kvs := r.Responses[0].GetResponseRange().Kvs
	return len(kvs) > 0 && string(kvs[0].Value) == m.name && clientv3.LeaseID(kvs[0].Lease) == m.lease, nil
}

// Compact discards etcd's history before rev. etcd answers once the
// compaction is decided and frees the space in the background, in
// batches (with 10,000 sources a minute of history is some 600,000 key
// versions, which took etcd more than 10 s to free here): waiting for it
// would only time out. A rev already compacted is not an error.
func (m *Member) Compact(ctx context.Context, rev int64) error {
	_, err := m.client.Compact(ctx, rev)
	if err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("cluster: compact etcd's history to revision %d: %w", rev, err)
	}
	return nil
}

// DBStatus is what etcd says of its database.
type DBStatus struct {
	// Size is the database file's size, InUse the bytes in use in it.
	Size, InUse int64
	// Revision is etcd's current revision.
	Revision int64
}

// Status asks the first of the client's endpoints that answers for the
// state of etcd's database.
func (m *Member) Status(ctx context.Context) (DBStatus, error) {
	var errs []error
	for _, ep := range m.client.Endpoints() {
		s, err := m.client.Status(ctx, ep)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return DBStatus{Size: s.DbSize, InUse: s.DbSizeInUse, Revision: s.Header.Revision}, nil
	}
	return DBStatus{}, fmt.Errorf("cluster: etcd status: %w", errors.Join(errs...))
}
