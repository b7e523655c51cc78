"""Tests of following a cluster: Cluster against real ZeroMQ sockets playing
the members, EtcdMembers against a real etcd. The etcd tests need the
servers go test ./clients/python starts (INGESTOR_TEST_ETCD, and
INGESTOR_TEST_ETCD_AUTH for one whose auth the test enables); run without
them, they fail rather than skip."""

import base64
import json
import logging
import os
import sqlite3
import tempfile
import threading
import time
import unittest
import urllib.request

import ingestor_processor as ip

from .test_client import FakeDaemon, TIMEOUT_MS, _quiet, start
from .test_wire import event, frame

WAIT = TIMEOUT_MS / 1000


def wait_for(test, what, cond):
    deadline = time.monotonic() + WAIT
    while not cond():
        if time.monotonic() > deadline:
            test.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def member(name, d):
    return ip.Member(name, d.endpoint, d.ack_endpoint)


class ScriptedMembers:
    """A membership the test changes by calling set()."""

    def __init__(self):
        self.update = None
        self.ready = threading.Event()

    def watch(self, stop, update):
        self.update = update
        self.ready.set()
        stop.wait()

    def set(self, *members):
        self.ready.wait(WAIT)
        self.update(list(members))


class ClusterTest(unittest.TestCase):
    def test_each_ack_goes_to_the_member_that_sent_the_frame(self):
        a, b = FakeDaemon(self), FakeDaemon(self)
        seen = []
        c = ip.Cluster(ip.StaticMembers([member("a", a), member("b", b)]), logger=_quiet)
        start(self, c, lambda ev: seen.append(ev.key))
        # Frame ids are per member: both send frame 1.
        a.send(frame(fid="1", events=[event("from-a")]))
        b.send(frame(fid="1", events=[event("from-b1"), event("from-b2")]))
        self.assertEqual(a.ack()["frames"], [1])
        self.assertEqual(b.ack()["frames"], [1])
        self.assertEqual(sorted(seen), ["from-a", "from-b1", "from-b2"])
        self.assertEqual(c.following(), ["a", "b"])
        # The counters move right after the ack leaves.
        wait_for(self, "the counters", lambda: (c.stats.frames, c.stats.events, c.stats.acked) == (2, 3, 3))

    def test_follows_joins_leaves_and_moves(self):
        a, b = FakeDaemon(self), FakeDaemon(self)
        members = ScriptedMembers()
        seen = []
        c = ip.Cluster(members, logger=_quiet)
        start(self, c, lambda ev: seen.append(ev.key))
        members.set(member("a", a))
        a.send(frame(fid="1", events=[event("a1")]))
        self.assertEqual(a.ack()["frames"], [1])
        members.set(member("a", a), member("b", b))  # b joins
        b.send(frame(fid="1", events=[event("b1")]))
        self.assertEqual(b.ack()["frames"], [1])
        members.set(member("b", b))  # a leaves: its client stops
        self.assertEqual(c.following(), ["b"])
        # a comes back with b's endpoints and b leaves: a new client, on
        # the moved endpoints, acks as a.
        members.set(ip.Member("a", b.endpoint, b.ack_endpoint))
        self.assertEqual(c.following(), ["a"])
        # b's first client has closed its socket; a frame sent before b
        # sees it go would be lost in its queue.
        b.wait_for_peers(connected=2, disconnected=1)
        b.send(frame(fid="2", events=[event("a2")]))
        self.assertEqual(b.ack()["frames"], [2])
        self.assertEqual(seen, ["a1", "b1", "a2"])
        # The stopped clients' counters stay in the sum.
        wait_for(self, "the counters", lambda: (c.stats.frames, c.stats.acked) == (3, 3))
        members.set()
        self.assertEqual(c.following(), [])

    def test_run_tx_applies_two_members_copies_once(self):
        path = os.path.join(tempfile.mkdtemp(), "sink.db")
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE events (source TEXT, key TEXT, PRIMARY KEY (source, key))")
        conn.commit()
        conn.close()
        a, b = FakeDaemon(self), FakeDaemon(self)
        c = ip.Cluster(ip.StaticMembers([member("a", a), member("b", b)]), logger=_quiet)

        def handle(conn, ev):  # a second application would fail the primary key
            conn.execute("INSERT INTO events VALUES (?, ?)", (ev.source, ev.key))

        start(self, c, handle, tx_db=path)
        # The same event from both members (fetched again after a failover).
        a.send(frame(fid="1", events=[event("dup"), event("only-a")]))
        b.send(frame(fid="7", events=[event("dup")]))
        self.assertEqual(a.ack()["frames"], [1])
        self.assertEqual(b.ack()["frames"], [7])
        conn = sqlite3.connect(path)
        self.addCleanup(conn.close)
        self.assertEqual(conn.execute("SELECT key FROM events ORDER BY key").fetchall(), [("dup",), ("only-a",)])
        wait_for(self, "the counters", lambda: (c.stats.acked, c.stats.duplicates, c.stats.failed) == (3, 1, 0))

    def test_options(self):
        d = FakeDaemon(self)
        with self.assertRaisesRegex(ValueError, "listed twice"):
            ip.StaticMembers([member("a", d), member("a", d)])
        with self.assertRaisesRegex(ValueError, "endpoint comes from the members"):
            ip.Cluster(ip.StaticMembers([]), endpoint="tcp://127.0.0.1:1")
        with self.assertRaisesRegex(ValueError, "path"):
            conn = sqlite3.connect(":memory:", isolation_level=None)
            self.addCleanup(conn.close)
            ip.Cluster(ip.StaticMembers([])).run_tx(conn, lambda conn, ev: None)
        with self.assertRaisesRegex(ValueError, "not an http"):
            ip.EtcdMembers("etcd:2379", "prod")
        with self.assertRaisesRegex(ValueError, "username and password go together"):
            ip.EtcdMembers("http://127.0.0.1:2379", "prod", username="u")

    def test_a_member_with_bad_options_is_logged_and_others_run(self):
        a = FakeDaemon(self)
        records = _Records()
        c = ip.Cluster(ip.StaticMembers([member("a", a), ip.Member("bad", "tcp://x:1", "tcp://x:1")]), logger=records.log)
        start(self, c, lambda ev: None)
        a.send(frame(fid="1", events=[event("k")]))
        self.assertEqual(a.ack()["frames"], [1])
        self.assertEqual(c.following(), ["a"])
        self.assertTrue(any("cannot follow a member: member=bad" in m and "must differ" in m for m in records.messages), records.messages)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []
        self.log = logging.getLogger(f"ingestor_processor.test.records.{id(self)}")
        self.log.propagate = False
        self.log.addHandler(self)
        self.log.setLevel(logging.DEBUG)

    def emit(self, record):
        self.messages.append(record.getMessage())


def etcd_endpoint(test, var="INGESTOR_TEST_ETCD"):
    ep = os.environ.get(var)
    if not ep:
        test.fail(f"${var} is not set: run these tests with go test ./clients/python, which starts etcd")
    return ep


def etcd_call(ep, path, body, token=None):
    req = urllib.request.Request(ep + path, data=json.dumps(body).encode(), method="POST")
    if token:
        req.add_header("Authorization", token)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def b64(s):
    return base64.b64encode(s.encode()).decode()


def put_member(ep, cluster, name, lease=None, value=None, token=None):
    if value is None:
        value = json.dumps({"member": name, "events": f"tcp://{name}:5557", "acks": f"tcp://{name}:5558", "version": "t"})
    body = {"key": b64(f"/ingestor/{cluster}/members/{name}"), "value": b64(value)}
    if lease is not None:
        body["lease"] = lease
    etcd_call(ep, "/v3/kv/put", body, token)


def ep_member(name):
    return ip.Member(name, f"tcp://{name}:5557", f"tcp://{name}:5558")


class EtcdMembersTest(unittest.TestCase):
    def test_reads_the_cluster_and_follows_changes(self):
        ep = etcd_endpoint(self)
        cluster = f"read{time.monotonic_ns()}"
        lease = etcd_call(ep, "/v3/lease/grant", {"TTL": 60})["ID"]
        put_member(ep, cluster, "m2", lease)
        put_member(ep, cluster, "m1", lease)
        put_member(ep, cluster, "garbage", lease, value="{not json")
        put_member(ep, cluster + "x", "other")  # a cluster whose name starts with this one's
        records = _Records()
        m = ip.EtcdMembers([ep], cluster, interval=0.05, logger=records.log)
        self.assertEqual(m.read(), [ep_member("m1"), ep_member("m2")])
        self.assertTrue(any("skipping member key" in r and "garbage" in r for r in records.messages), records.messages)

        updates = []
        stop = threading.Event()
        t = threading.Thread(target=m.watch, args=(stop, updates.append), daemon=True)
        t.start()
        self.addCleanup(lambda: (stop.set(), t.join(WAIT)))
        wait_for(self, "the first list", lambda: updates)
        self.assertEqual(updates[0], [ep_member("m1"), ep_member("m2")])
        put_member(ep, cluster, "m3")
        wait_for(self, "m3 joining", lambda: updates[-1] == [ep_member("m1"), ep_member("m2"), ep_member("m3")])
        etcd_call(ep, "/v3/lease/revoke", {"ID": lease})  # m1 and m2 leave as a lost lease does
        wait_for(self, "m1 and m2 leaving", lambda: updates[-1] == [ep_member("m3")])
        n = len(updates)
        time.sleep(0.3)  # a few reads with no change: no update
        self.assertEqual(len(updates), n, "an unchanged membership was reported again")

    def test_keeps_the_last_list_while_etcd_is_unreachable(self):
        ep = etcd_endpoint(self)
        cluster = f"down{time.monotonic_ns()}"
        put_member(ep, cluster, "m1")
        dead = "http://127.0.0.1:1"
        records = _Records()
        # A dead endpoint first: the next one answers.
        m = ip.EtcdMembers([dead, ep], cluster, interval=0.05, timeout=1, logger=records.log)
        self.assertEqual(m.read(), [ep_member("m1")])
        updates = []
        stop = threading.Event()
        t = threading.Thread(target=m.watch, args=(stop, updates.append), daemon=True)
        t.start()
        self.addCleanup(lambda: (stop.set(), t.join(WAIT)))
        wait_for(self, "the first list", lambda: updates == [[ep_member("m1")]])
        m.endpoints = [dead]  # etcd unreachable
        wait_for(self, "the failure logged", lambda: any("keeping the last list" in r for r in records.messages))
        time.sleep(0.3)
        self.assertEqual(updates, [[ep_member("m1")]], "the list changed while etcd was unreachable")
        self.assertEqual(sum("keeping the last list" in r for r in records.messages), 1, "logged at every failed read")
        put_member(ep, cluster, "m2")
        m.endpoints = [ep]
        wait_for(self, "m2 after etcd answers again", lambda: updates[-1] == [ep_member("m1"), ep_member("m2")])

    def test_authenticates_and_never_logs_the_password(self):
        ep = etcd_endpoint(self, "INGESTOR_TEST_ETCD_AUTH")
        password = "s3cret-pw-never-logged"
        etcd_call(ep, "/v3/auth/user/add", {"name": "root", "password": password})
        etcd_call(ep, "/v3/auth/role/add", {"name": "root"})
        etcd_call(ep, "/v3/auth/user/grant", {"user": "root", "role": "root"})
        etcd_call(ep, "/v3/auth/enable", {})
        token = etcd_call(ep, "/v3/auth/authenticate", {"name": "root", "password": password})["token"]
        put_member(ep, "auth", "m1", token=token)
        with self.assertRaises(ip.EtcdError):  # auth is on: no reading without it
            ip.EtcdMembers([ep], "auth").read()
        self.assertEqual(ip.EtcdMembers([ep], "auth", username="root", password=password).read(), [ep_member("m1")])
        with self.assertRaises(ip.EtcdError) as cm:
            ip.EtcdMembers([ep], "auth", username="root", password=password + "x").read()
        self.assertIn("authenticate", str(cm.exception))
        self.assertNotIn(password, str(cm.exception))


if __name__ == "__main__":
    unittest.main()
