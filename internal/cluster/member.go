package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Options describe the member to join as.
type Options struct {
	// Cluster is the cluster's name, Member this daemon's; both are
	// path components of etcd keys (config checks them).
	Cluster, Member string
	// TTL is the lease's time to live, whole seconds, at least 2s.
	TTL time.Duration
	// Info is the member key's value (the endpoints processors use).
	Info []byte
	// RebalanceDelay, when positive, gives the member a seat: a key under
	// a lease of its own that outlives the member's lease by this long,
	// so that placement keeps the member's sources for it while it is
	// away (restarting) and moves them only after the delay.
	RebalanceDelay time.Duration
	// Logger receives the lease's troubles; nil discards them.
	Logger *slog.Logger
}

// Member is this daemon's membership: one etcd lease, kept alive, with
// the member key and the ownership keys of the sources it holds under
// it. Once lost (Lost is closed) a Member stays lost; the daemon joins
// again with a new one.
type Member struct {
	client *clientv3.Client
	keys   keys
	name   string
	lease  clientv3.LeaseID
	ttl    time.Duration
	// seat is the seat's lease (0 without one), delay the rebalance delay.
	seat   clientv3.LeaseID
	delay  time.Duration
	margin time.Duration
	log    *slog.Logger

	mu         sync.Mutex
	validUntil time.Time
	lost       chan struct{}
	lostWhy    string

	stop context.CancelFunc
	done chan struct{}
}

// ErrMemberTaken is returned by Join when another live daemon has the
// member name.
var ErrMemberTaken = errors.New("the member name is taken")

// Join grants a lease, creates the member key under it (failing with
// ErrMemberTaken when it exists) and keeps the lease alive until Leave,
// or until it is lost.
func Join(ctx context.Context, client *clientv3.Client, o Options) (*Member, error) {
	if o.TTL < 2*time.Second {
		return nil, fmt.Errorf("cluster lease TTL %v: at least 2s", o.TTL)
	}
	m := &Member{client: client, keys: keys{cluster: o.Cluster}, name: o.Member, ttl: o.TTL, delay: max(0, o.RebalanceDelay),
		margin: max(500*time.Millisecond, o.TTL/10), log: o.Logger, lost: make(chan struct{}), done: make(chan struct{})}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	sent := time.Now()
	g, err := client.Grant(ctx, int64(o.TTL/time.Second))
	if err != nil {
		return nil, fmt.Errorf("cluster %q: grant a lease: %w", o.Cluster, err)
	}
	m.lease = clientv3.LeaseID(g.ID)
	m.validUntil = sent.Add(time.Duration(g.TTL)*time.Second - m.margin)
	key := m.keys.member(o.Member)
	r, err := client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(o.Info), clientv3.WithLease(m.lease))).Commit()
	if err == nil && !r.Succeeded {
		err = fmt.Errorf("%w: %s exists (another daemon runs as %q, or this one's previous lease has not expired yet)", ErrMemberTaken, key, o.Member)
	}
	if err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, rerr := client.Revoke(rctx, m.lease)
		return nil, errors.Join(fmt.Errorf("cluster %q: join as %q: %w", o.Cluster, o.Member, err), ignoreNotFound(rerr))
	}
	if m.delay > 0 {
		if err := m.takeSeat(ctx, m.ttl+m.delay); err != nil {
			m.log.Warn("cluster: taking the member's seat failed; its sources move at once if it goes away", "member", m.name, "err", err)
		}
	}
	kctx, stop := context.WithCancel(context.Background())
	m.stop = stop
	go m.keepAlive(kctx)
	return m, nil
}

// takeSeat puts the member's seat key under a new lease of ttl, and
// revokes the lease it had (a previous run's), which the key no longer
// depends on.
func (m *Member) takeSeat(ctx context.Context, ttl time.Duration) error {
	key := m.keys.seat(m.name)
	old, err := m.client.Get(ctx, key)
	if err != nil {
		return err
	}
	g, err := m.client.Grant(ctx, int64((ttl+time.Second-1)/time.Second))
	if err != nil {
		return err
	}
	if _, err := m.client.Put(ctx, key, m.name, clientv3.WithLease(g.ID)); err != nil {
		return err
	}
	m.mu.Lock()
	m.seat = g.ID
	m.mu.Unlock()
	if len(old.Kvs) > 0 && old.Kvs[0].Lease != 0 && clientv3.LeaseID(old.Kvs[0].Lease) != g.ID {
		_, err = m.client.Revoke(ctx, clientv3.LeaseID(old.Kvs[0].Lease))
		return ignoreNotFound(err)
	}
	return nil
}

// renewSeat keeps the seat's lease alive, and takes the seat again when
// etcd no longer knows it.
func (m *Member) renewSeat(ctx context.Context) {
	m.mu.Lock()
	seat := m.seat
	m.mu.Unlock()
	if m.delay <= 0 {
		return
	}
	var err error
	if seat != 0 {
		var r *clientv3.LeaseKeepAliveResponse
		r, err = m.client.KeepAliveOnce(ctx, seat)
		if err == nil && r.TTL > 0 {
			return
		}
	}
	if seat == 0 || errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil {
		err = m.takeSeat(ctx, m.ttl+m.delay)
	}
	if err != nil && ctx.Err() == nil {
		m.log.Warn("cluster: renewing the member's seat failed; retrying", "member", m.name, "err", err)
	}
}

// Name returns the member's name.
func (m *Member) Name() string { return m.name }

// Valid reports whether the lease is still valid as the member sees it:
// it is not lost and its local deadline has not passed.
func (m *Member) Valid() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lostWhy == "" && time.Now().Before(m.validUntil)
}

// Deadline returns when the lease ends as the member sees it unless a
// keepalive extends it: work done on behalf of the lease (a poll) must
// end by then.
func (m *Member) Deadline() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lostWhy != "" {
		return time.Time{}
	}
	return m.validUntil
}

// Lost is closed when the lease is lost: its local deadline passed with
// no keepalive answered, or etcd no longer knows it. LostReason says why.
func (m *Member) Lost() <-chan struct{} { return m.lost }

// LostReason returns why the lease was lost, "" while it is not.
func (m *Member) LostReason() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lostWhy
}

// keepAlive renews the lease every third of its TTL, retrying sooner
// after a failure, and declares it lost once its local deadline passes
// or etcd answers that it does not know it.
func (m *Member) keepAlive(ctx context.Context) {
	defer close(m.done)
	wait := m.ttl / 3
	for {
		deadline := m.Deadline()
		t := time.NewTimer(min(wait, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if !m.Valid() {
			m.lose("no keepalive was answered within the lease's TTL")
			return
		}
		sent := time.Now()
		kctx, cancel := context.WithDeadline(ctx, m.Deadline())
		r, err := m.client.KeepAliveOnce(kctx, m.lease)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && r.TTL > 0:
			m.extend(sent.Add(time.Duration(r.TTL)*time.Second - m.margin))
			wait = m.ttl / 3
			sctx, cancel := context.WithTimeout(ctx, m.ttl/3)
			m.renewSeat(sctx)
			cancel()
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil:
			m.lose("etcd no longer knows the lease (it expired)")
			return
		default:
			m.log.Warn("cluster: lease keepalive failed; retrying", "member", m.name, "err", err, "valid_for", time.Until(m.Deadline()).Round(time.Millisecond))
			wait = max(100*time.Millisecond, m.ttl/12)
		}
	}
}

func (m *Member) extend(until time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lostWhy == "" && until.After(m.validUntil) {
		m.validUntil = until
	}
}

func (m *Member) lose(why string) {
	m.mu.Lock()
	first := m.lostWhy == ""
	if first {
		m.lostWhy = why
		close(m.lost)
	}
	m.mu.Unlock()
	if first && why != leftReason {
		m.log.Error("cluster: lease lost; this member stops its sources and joins again", "member", m.name, "reason", why)
	}
}

// Leave stops the keepalives and revokes the lease, which deletes the
// member key and every ownership key still held: release sources first
// (Ownership.Release) to hand them over with their final checkpoint.
// With a rebalance delay the seat stays for that long (a restart within
// it finds its sources still placed on it); without, it goes too.
func (m *Member) Leave(ctx context.Context) error {
	m.stop()
	<-m.done
	m.lose(leftReason)
	m.mu.Lock()
	seat := m.seat
	m.mu.Unlock()
	if seat != 0 {
		if err := m.takeSeat(ctx, m.delay); err != nil {
			m.log.Warn("cluster: shortening the member's seat failed; it lasts its full TTL", "member", m.name, "err", err)
		}
	}
	_, err := m.client.Revoke(ctx, m.lease)
	if err = ignoreNotFound(err); err != nil {
		return fmt.Errorf("cluster: revoke the lease of %q: %w", m.name, err)
	}
	return nil
}

// Revoke ends a member already lost: etcd forgets its lease (and the keys
// under it) at once instead of at its expiry, so that the daemon can join
// again at once under the same name. The seat is left alone.
func (m *Member) Revoke(ctx context.Context) error {
	m.stop()
	<-m.done
	m.lose(leftReason)
	_, err := m.client.Revoke(ctx, m.lease)
	return ignoreNotFound(err)
}

// SetInfo rewrites the member key's value (under the same lease).
func (m *Member) SetInfo(ctx context.Context, info []byte) error {
	if _, err := m.client.Put(ctx, m.keys.member(m.name), string(info), clientv3.WithLease(m.lease)); err != nil {
		return fmt.Errorf("cluster: update the member key of %q: %w", m.name, err)
	}
	return nil
}

// leftReason is why a member that left on purpose is lost: not an error.
const leftReason = "left the cluster"

// ignoreNotFound drops the error of revoking a lease etcd no longer has.
func ignoreNotFound(err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}
