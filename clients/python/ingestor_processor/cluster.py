"""Following a cluster of daemons (their [cluster] mode): one Client per
member, started and stopped as members join and leave, so that each ack
goes back to the member that sent the frame. The members come from a fixed
list (StaticMembers) or from etcd (EtcdMembers), as in the Go package's
processor.RunCluster."""

import base64
import json
import logging
import sqlite3
import threading
from typing import NamedTuple

from .client import Client, Stats, log

DEFAULT_ETCD_INTERVAL = 1.0  # seconds between two reads of the members
DEFAULT_ETCD_TIMEOUT = 5.0  # seconds an etcd request may take

# _JOIN_TIMEOUT bounds the wait for a member's client to return after
# stop(), in seconds: it returns after the event its handler is on.
_JOIN_TIMEOUT = 60.0


class Member(NamedTuple):
    """One daemon of a cluster as a processor reaches it: the value of its
    member key /ingestor/CLUSTER/members/NAME in etcd."""

    name: str  # its cluster.member_name
    endpoint: str  # its publish.endpoint, host as advertised
    ack_endpoint: str  # its publish.ack_endpoint, host as advertised


class StaticMembers:
    """A membership fixed by hand: a list of Member."""

    def __init__(self, members):
        self.members = [Member(*m) for m in members]
        errs = []
        names = set()
        for m in self.members:
            if not m.name or not m.endpoint or not m.ack_endpoint:
                errs.append(f"member {m!r} needs a name, an endpoint and an ack endpoint")
            elif m.name in names:
                errs.append(f"member {m.name!r} is listed twice")
            names.add(m.name)
        if errs:
            raise ValueError("ingestor_processor: " + "; ".join(errs))

    def watch(self, stop, update):
        """Calls update with the members once, then waits until the
        threading.Event stop is set."""
        update(list(self.members))
        while not stop.wait(0.5):
            pass


class EtcdError(Exception):
    """etcd could not be read: every endpoint failed. The text names the
    endpoints and their errors, never the password."""


class EtcdMembers:
    """A cluster's membership in etcd, read through etcd's JSON gateway
    (POST /v3/kv/range, in etcd 3.4 and later) with the standard library.

    endpoints are etcd's client URLs (http:// or https://), tried in turn;
    cluster is the daemons' cluster.name. ca_file verifies etcd's
    certificate (default: the system's CAs); cert_file and key_file are a
    client certificate; username and password authenticate (the password
    is never logged). watch reads the members every interval seconds and
    reports each change; while etcd cannot be read it keeps the last list,
    so the processors go on consuming from the members they know."""

    def __init__(self, endpoints, cluster, *, ca_file=None, cert_file=None, key_file=None, username=None,
                 password=None, interval=DEFAULT_ETCD_INTERVAL, timeout=DEFAULT_ETCD_TIMEOUT, logger=None):
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e]
        errs = []
        if not endpoints:
            errs.append("at least one etcd endpoint is required")
        for e in endpoints:
            if not (e.startswith("http://") or e.startswith("https://")):
                errs.append(f"etcd endpoint {e!r} is not an http:// or https:// URL")
        if not cluster or "/" in cluster:
            errs.append(f"cluster name {cluster!r} must be non-empty without '/'")
        if (cert_file is None) != (key_file is None):
            errs.append("etcd cert_file and key_file go together")
        if (username is None) != (password is None):
            errs.append("etcd username and password go together")
        if interval <= 0 or timeout <= 0:
            errs.append("interval and timeout must be positive")
        if errs:
            raise ValueError("ingestor_processor: " + "; ".join(errs))
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.cluster = cluster
        self.interval = interval
        self.timeout = timeout
        self.log = logger or log
        self._username, self._password = username, password
        self._token = None
        self._ssl = None
        if any(e.startswith("https://") for e in self.endpoints):
            import ssl  # here, not at the top: a processor of one daemon never pays for it
            self._ssl = ssl.create_default_context(cafile=ca_file)
            if cert_file is not None:
                self._ssl.load_cert_chain(cert_file, key_file)

    @property
    def prefix(self):
        return f"/ingestor/{self.cluster}/members/"

    def read(self):
        """Returns the members now in etcd, sorted by name. Raises EtcdError
        when no endpoint answers."""
        p = self.prefix.encode()
        body = {"key": _b64(p), "range_end": _b64(p[:-1] + bytes([p[-1] + 1]))}
        resp = self._call("/v3/kv/range", body)
        members = {}
        for kv in resp.get("kvs", []):
            key = base64.b64decode(kv.get("key", "")).decode("utf-8", "replace")
            try:
                v = json.loads(base64.b64decode(kv.get("value", "")))
                m = Member(v["member"], v["events"], v["acks"])
                if not (isinstance(m.name, str) and isinstance(m.endpoint, str) and isinstance(m.ack_endpoint, str)
                        and m.name and m.endpoint and m.ack_endpoint):
                    raise ValueError("empty or not strings")
            except (ValueError, KeyError, TypeError) as e:
                self.log.warning("etcd: skipping member key %s, which does not name a member and its endpoints: %s", key, e)
                continue
            members[m.name] = m
        return [members[n] for n in sorted(members)]

    def watch(self, stop, update):
        """Calls update with the members at once and then each time they
        change, until the threading.Event stop is set. Before etcd first
        answers, and while it does not, the last list stands."""
        last = None
        failing = False
        while not stop.is_set():
            try:
                members = self.read()
            except EtcdError as e:
                if not failing:
                    self.log.warning("etcd: reading the cluster's members failed; keeping the last list: %s", e)
                failing = True
            else:
                if failing:
                    self.log.info("etcd: reading the cluster's members again")
                failing = False
                if members != last:
                    update(members)
                    last = members
            stop.wait(self.interval)

    def _call(self, path, body):
        errs = []
        for ep in self.endpoints:
            try:
                if self._username is not None and self._token is None:
                    self._token = self._post(ep, "/v3/auth/authenticate",
                                             {"name": self._username, "password": self._password}).get("token")
                    if not self._token:
                        raise EtcdError("authenticate: no token in the answer")
                return self._post(ep, path, body)
            except (OSError, ValueError, EtcdError) as e:  # URLError and HTTPError are OSErrors
                self._token = None  # it may have expired; authenticate again
                errs.append(f"{ep}: {e}")
        raise EtcdError("; ".join(errs))

    def _post(self, endpoint, path, body):
        import urllib.error  # here, not at the top: urllib.request takes ~40 ms to import
        import urllib.request
        req = urllib.request.Request(endpoint + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        if self._token is not None and path != "/v3/auth/authenticate":
            req.add_header("Authorization", self._token)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise EtcdError(f"{path}: HTTP {e.code}: {_etcd_message(e)}") from None
        if not isinstance(out, dict):
            raise EtcdError(f"{path}: the answer is not a JSON object")
        if "error" in out or "code" in out and out.get("code"):
            raise EtcdError(f"{path}: {out.get('error') or out.get('message')}")
        return out


def _b64(b):
    return base64.b64encode(b).decode()


def _etcd_message(e):
    try:
        v = json.loads(e.read())
        return str(v.get("error") or v.get("message") or v)[:200]
    except (ValueError, OSError, AttributeError):
        return e.reason


class _MemberLog(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        return f"{msg} (member={self.extra['member']})", kwargs


class Cluster:
    """Processes the events of every member of a cluster: one Client per
    member, each on its own thread, made with client_options (the Client
    keyword arguments: receive_hwm, ack_flush_interval, dedupe_db,
    curve_server_key, curve_secret_key, ...) and the member's endpoints.
    Clients start and stop as members join and leave; a member whose
    endpoints change gets a new Client. A Client that fails is logged and
    started again at the next change of membership.

    Every member sends its own copy of an event its source fetched twice
    across a failover (PROTOCOL.md, "Several daemons"): run_tx with one
    database for all members applies it once (each transaction checks the
    processed keys under the write lock); run with dedupe_db skips copies
    handled before but does not rule out two members' copies being handled
    at the same moment.

    run and run_tx block until stop() is called (from a signal handler or
    another thread), then stop every member's client and return.
    """

    def __init__(self, members, *, logger=None, **client_options):
        if not hasattr(members, "watch"):
            raise ValueError("ingestor_processor: members must be a StaticMembers, an EtcdMembers or have watch(stop, update)")
        for k in ("endpoint", "ack_endpoint"):
            if k in client_options:
                raise ValueError(f"ingestor_processor: {k} comes from the members, not the options")
        self.members = members
        self.client_options = client_options
        self.log = logger or log
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._clients = {}  # member name -> (Member, Client, Thread)
        self._retired = Stats()

    def stop(self):
        """Asks run or run_tx to stop; safe from a signal handler and any
        thread."""
        self._stop.set()

    def stopping(self):
        return self._stop.is_set()

    @property
    def stats(self):
        """The counters of every member's client, summed."""
        with self._lock:
            total = Stats()
            for s in [self._retired] + [c.stats for _, c, _ in self._clients.values()]:
                for k in Stats.__slots__:
                    setattr(total, k, getattr(total, k) + getattr(s, k))
            return total

    def following(self):
        """The members whose clients run now, sorted by name."""
        with self._lock:
            return sorted(n for n, (_, _, t) in self._clients.items() if t.is_alive())

    def run(self, handler):
        """Calls handler(event) for the events of every member (see
        Client.run), on one thread per member."""
        if handler is None:
            raise ValueError("ingestor_processor: handler is required")
        self._serve(lambda c: c.run(handler))

    def run_tx(self, db, handler):
        """Calls handler(conn, event) for the events of every member with
        exactly-once effects (see Client.run_tx) in the SQLite database at
        the path db, which each member's client opens on its own thread."""
        if handler is None:
            raise ValueError("ingestor_processor: handler is required")
        if isinstance(db, sqlite3.Connection):
            raise ValueError("ingestor_processor: Cluster.run_tx needs the database's path (each member's "
                             "client opens its own connection), not a connection")
        self._serve(lambda c: c.run_tx(db, handler))

    def _serve(self, run):
        try:
            self.members.watch(self._stop, lambda members: self._update(members, run))
        finally:
            with self._lock:
                for name in sorted(self._clients):
                    self._retire(name)

    def _update(self, members, run):
        want = {m.name: m for m in members if m.name}
        with self._lock:
            for name in sorted(self._clients):
                m, _, t = self._clients[name]
                if want.get(name) == m and t.is_alive():
                    continue
                self._retire(name)
                self.log.info("stopped following a member: member=%s", name)
            if self._stop.is_set():
                return
            for name in sorted(want.keys() - self._clients.keys()):
                m = want[name]
                try:
                    c = Client(m.endpoint, m.ack_endpoint, logger=_MemberLog(self.log, {"member": name}),
                               **self.client_options)
                except ValueError as e:
                    self.log.error("cannot follow a member: member=%s: %s", name, e)
                    continue
                t = threading.Thread(target=self._run_member, args=(name, c, run), name=f"member {name}", daemon=True)
                self._clients[name] = (m, c, t)
                t.start()
                self.log.info("following a member: member=%s endpoint=%s ack_endpoint=%s", name, m.endpoint, m.ack_endpoint)

    def _run_member(self, name, client, run):
        try:
            run(client)
        except Exception as e:
            if not client.stopping():
                self.log.error("following member %s failed; it starts again at the next change of membership: %r",
                               name, e)

    def _retire(self, name):
        """Stops the member's client and waits for it; holds _lock."""
        _, c, t = self._clients.pop(name)
        c.stop()
        t.join(_JOIN_TIMEOUT)
        if t.is_alive():
            self.log.error("member %s's client did not stop within %.0f s (its handler is stuck)", name, _JOIN_TIMEOUT)
        for k in Stats.__slots__:
            setattr(self._retired, k, getattr(self._retired, k) + getattr(c.stats, k))
