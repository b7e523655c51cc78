"""Tests of the client against real ZeroMQ sockets playing the daemon, and
real SQLite files."""

import json
import os
import sqlite3
import tempfile
import threading
import time
import unittest

import zmq

import ingestor_processor as ip

from .test_wire import event, frame

TIMEOUT_MS = 30_000


class FakeDaemon:
    """The daemon's two sockets, bound on loopback, optionally CURVE servers."""

    def __init__(self, test, curve_secret=None):
        self.ctx = zmq.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.pull = self.ctx.socket(zmq.PULL)
        for s in (self.push, self.pull):
            s.setsockopt(zmq.LINGER, 0)
            if curve_secret is not None:
                s.setsockopt(zmq.CURVE_SERVER, 1)
                s.setsockopt(zmq.CURVE_SECRETKEY, curve_secret.encode())
        self.pull.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        self.push.setsockopt(zmq.SNDTIMEO, TIMEOUT_MS)
        self.push.bind("tcp://127.0.0.1:*")
        self.pull.bind("tcp://127.0.0.1:*")
        # What the push socket saw (wait_for_peers, and a send that times
        # out says it).
        self.push_events = self.push.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED |
                                                        zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.seen = []
        self.endpoint = self.push.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.ack_endpoint = self.pull.getsockopt(zmq.LAST_ENDPOINT).decode()
        test.addCleanup(self.close)

    def close(self):
        self.push.disable_monitor()
        self.push_events.close(0)
        self.push.close()
        self.pull.close()
        self.ctx.term()

    def send(self, *parts):
        try:
            self.push.send_multipart([p.encode() if isinstance(p, str) else p for p in parts])
        except zmq.Again:
            self._read_events(0)
            raise AssertionError(f"no processor took a frame from {self.endpoint} within {TIMEOUT_MS} ms "
                                 f"(none connected, or its queue stayed full); the socket saw: {self.seen}") from None

    def wait_for_peers(self, connected, disconnected=0):
        """Waits until processors have connected to the push socket (their
        handshake done) connected times in all and disconnected
        disconnected times. A frame sent to a processor that has closed
        its socket but whose disconnect the push socket has not seen yet
        is lost (the daemon would send it again after its ack timeout;
        this fake does not)."""
        deadline = time.monotonic() + TIMEOUT_MS / 1000

        def count(name):
            return sum(e.startswith(name + " ") for e in self.seen)

        while count("HANDSHAKE_SUCCEEDED") < connected or count("DISCONNECTED") < disconnected:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the push socket {self.endpoint} did not see {connected} processors connect "
                                     f"and {disconnected} leave within {TIMEOUT_MS} ms; it saw: {self.seen}")
            self._read_events(left)

    def _read_events(self, timeout):
        """Adds the push socket's events to seen, waiting up to timeout
        seconds for the first."""
        from zmq.utils.monitor import recv_monitor_message
        if not self.push_events.poll(int(timeout * 1000)):
            return
        while True:
            try:
                m = recv_monitor_message(self.push_events, zmq.NOBLOCK)
            except zmq.Again:
                return
            self.seen.append(f"{zmq.Event(m['event']).name} {m['endpoint'].decode()}")

    def ack(self):
        try:
            return json.loads(self.pull.recv())
        except zmq.Again:
            raise AssertionError(f"no ack came to {self.ack_endpoint} within {TIMEOUT_MS} ms") from None


def start(test, client, handler, tx_db=None):
    """Runs client in a thread until the test ends."""
    errors = []

    def run():
        try:
            if tx_db is None:
                client.run(handler)
            else:
                client.run_tx(tx_db, handler)
        except BaseException as e:  # reported by the cleanup
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def stop():
        client.stop()
        t.join(TIMEOUT_MS / 1000)
        test.assertFalse(t.is_alive(), "run did not return after stop()")
        test.assertEqual(errors, [])

    test.addCleanup(stop)
    return stop


def quiet_client(d, **kw):
    return ip.Client(d.endpoint, d.ack_endpoint, logger=_quiet, **kw)


_quiet = __import__("logging").getLogger("ingestor_processor.test")
_quiet.disabled = True


class RunTest(unittest.TestCase):
    def test_acks_nacks_and_malformed_frames(self):
        d = FakeDaemon(self)
        seen = []

        def handle(ev):
            seen.append(ev.key)
            if ev.key == "bad":
                raise ValueError("cannot index it")
            if ev.key == "poison":
                raise ip.Permanent("poison: " + "é" * 1000)

        c = quiet_client(d)
        start(self, c, handle)
        # Malformed messages first: none may be acked, and the client must
        # survive them.
        d.send(frame(head='"v":1.0,"type":"events"', fid="1"))
        d.send(frame(fid="2"), frame(fid="2"))
        d.send(b"\xef\xbb\xbf" + frame(fid="3").encode())
        d.send(frame(fid="4", events=[event("a"), event("bad"), event("poison"), event("b")]))
        ack = d.ack()
        self.assertNotIn("frames", ack)
        self.assertEqual(ack["keys"], [{"frame": 4, "source": "s", "key": "a"}, {"frame": 4, "source": "s", "key": "b"}])
        self.assertEqual(len(ack["nacks"]), 2)
        bad, poison = ack["nacks"]
        self.assertEqual((bad["key"], bad["reason"], "permanent" in bad), ("bad", "ValueError: cannot index it", False))
        self.assertEqual((poison["key"], poison["permanent"]), ("poison", True))
        self.assertTrue(poison["reason"].startswith("poison: é"))
        self.assertLessEqual(len(poison["reason"].encode()), ip.MAX_REASON_BYTES)
        d.send(frame(fid="5", events=[event("c")]))
        self.assertEqual(d.ack(), {"v": 1, "type": "ack", "frames": [5]})
        self.assertEqual(seen, ["a", "bad", "poison", "b", "c"])
        s = c.stats
        self.assertEqual((s.frames, s.malformed, s.failed, s.permanent, s.events), (2, 3, 2, 1, 5))

    def test_acks_are_batched_within_the_limits(self):
        d = FakeDaemon(self)
        n = 2 * ip.MAX_BATCH_FRAMES + 44
        gate = threading.Event()
        # A long flush interval: acks leave when a batch is full or nothing
        # more is waiting. The first frame is held until every frame is
        # sent, so that frames pile up behind it.
        c = quiet_client(d, ack_flush_interval=3600)
        stop = start(self, c, lambda ev: gate.wait(TIMEOUT_MS / 1000))
        for i in range(1, n + 1):
            d.send(frame(fid=str(i), events=[event("k%d" % i)]))
        gate.set()
        acked, messages = [], 0
        while len(acked) < n:
            ack = d.ack()
            messages += 1
            self.assertLessEqual(len(ack["frames"]), ip.MAX_BATCH_FRAMES)
            acked += ack["frames"]
        self.assertEqual(sorted(acked), list(range(1, n + 1)))
        self.assertLess(messages, n // 2, "acks were not batched")
        stop()  # the counters are updated after each send
        self.assertEqual(c.stats.acked, n)

    def test_stop_between_events_flushes_the_acks(self):
        d = FakeDaemon(self)
        c = quiet_client(d, ack_flush_interval=3600)
        seen = []

        def handle(ev):
            seen.append(ev.key)
            if ev.key == "b":
                c.stop()

        stop = start(self, c, handle)
        d.send(frame(fid="7", events=[event("a"), event("b"), event("c")]))
        ack = d.ack()
        stop()
        # c was not handled: it is left for redelivery, neither acked nor
        # nacked.
        self.assertEqual(seen, ["a", "b"])
        self.assertEqual(ack, {"v": 1, "type": "ack", "keys": [{"frame": 7, "source": "s", "key": "a"},
                                                               {"frame": 7, "source": "s", "key": "b"}]})

    def test_dedupe_db_skips_processed_events_across_clients(self):
        path = os.path.join(tempfile.mkdtemp(), "dedupe?#.db")
        seen = []
        for round in range(2):
            d = FakeDaemon(self)
            c = quiet_client(d, dedupe_db=path)
            stop = start(self, c, lambda ev: seen.append(ev.key))
            d.send(frame(fid="1", events=[event("a"), event("b")]))
            self.assertEqual(d.ack()["frames"], [1])
            stop()
        self.assertEqual(seen, ["a", "b"])
        self.assertEqual(c.stats.duplicates, 2)


class RunTxTest(unittest.TestCase):
    def setUp(self):
        self.path = os.path.join(tempfile.mkdtemp(), "sink.db")
        conn = sqlite3.connect(self.path)
        conn.execute("CREATE TABLE events (source TEXT, key TEXT, n INTEGER, PRIMARY KEY (source, key))")
        conn.commit()
        conn.close()

    def rows(self):
        conn = sqlite3.connect(self.path)
        try:
            return conn.execute("SELECT key FROM events ORDER BY key").fetchall()
        finally:
            conn.close()

    def test_exactly_once(self):
        calls = []

        def handle(conn, ev):
            calls.append(ev.key)
            conn.execute("INSERT INTO events VALUES (?, ?, ?)", (ev.source, ev.key, ev.seq))
            if ev.key == "bad":
                raise RuntimeError("after a write")  # the write is undone
            if ev.key == "poison":
                raise ip.Permanent("poison")

        d = FakeDaemon(self)
        c = quiet_client(d)
        stop = start(self, c, handle, tx_db=self.path)
        d.send(frame(fid="1", events=[event("a"), event("bad"), event("poison"), event("b")]))
        ack = d.ack()
        self.assertEqual([k["key"] for k in ack["keys"]], ["a", "b"])
        self.assertEqual([(n["key"], n.get("permanent", False)) for n in ack["nacks"]], [("bad", False), ("poison", True)])
        self.assertEqual(self.rows(), [("a",), ("b",)])
        # A redelivery (the ack was lost): a and b are skipped, from the
        # cache, and acked again; bad is tried again.
        d.send(frame(fid="1", events=[event("a"), event("bad"), event("b")]))
        ack = d.ack()
        self.assertEqual([k["key"] for k in ack["keys"]], ["a", "b"])
        self.assertEqual(c.stats.duplicates, 2)
        stop()
        # A new processor (an empty cache, as after a crash between the
        # commit and the ack) finds the keys in the processed table.
        d2 = FakeDaemon(self)
        c2 = quiet_client(d2)
        start(self, c2, handle, tx_db=self.path)
        d2.send(frame(fid="1", events=[event("a"), event("b")]))
        self.assertEqual(d2.ack()["frames"], [1])
        self.assertEqual(c2.stats.duplicates, 2)
        self.assertEqual(calls, ["a", "bad", "poison", "b", "bad"])
        self.assertEqual(self.rows(), [("a",), ("b",)])

    def processed(self):
        conn = sqlite3.connect(self.path)
        try:
            return [k for (k,) in conn.execute("SELECT key FROM processed ORDER BY key")]
        finally:
            conn.close()

    def test_retention_forgets_keys(self):
        """Keys older than dedupe_retention (of running time) are deleted
        between frames, and the effects stay: the table stays bounded."""
        def handle(conn, ev):
            conn.execute("INSERT INTO events VALUES (?, ?, ?)", (ev.source, ev.key, ev.seq))

        d = FakeDaemon(self)
        c = quiet_client(d, dedupe_retention=0.2)
        start(self, c, handle, tx_db=self.path)
        d.send(frame(fid="1", events=[event("a"), event("b")]))
        self.assertEqual(d.ack()["frames"], [1])
        deadline = time.monotonic() + 30
        n = 1
        while "a" in self.processed() or "b" in self.processed():
            self.assertLess(time.monotonic(), deadline, "a and b were never forgotten")
            n += 1  # a frame boundary, where a due pass runs
            d.send(frame(fid=str(n), events=[event(f"k{n}")]))
            self.assertEqual(d.ack()["frames"], [n])
            time.sleep(0.05)  # the poll step of a wait for a condition
        self.assertGreaterEqual(c.stats.forgotten, 2)
        self.assertEqual(self.rows()[:2], [("a",), ("b",)])

    def test_retention_counts_running_time_not_downtime(self):
        """A key applied before a stop whose ack was lost comes again once
        a processor is back, however long that took: an hour of downtime
        (the stored clock and the key moved an hour back, as the wall clock
        would have moved past them) must not age it past a 30-minute
        retention. On the wall clock it would be forgotten at once."""
        calls = []

        def handle(conn, ev):
            calls.append(ev.key)
            conn.execute("INSERT INTO events VALUES (?, ?, ?)", (ev.source, ev.key, ev.seq))

        d = FakeDaemon(self)
        c = quiet_client(d)
        stop = start(self, c, handle, tx_db=self.path)
        d.send(frame(fid="1", events=[event("a")]))
        self.assertEqual(d.ack()["frames"], [1])
        stop()
        conn = sqlite3.connect(self.path)
        hour = 3600 * 10**9
        conn.execute("UPDATE processed SET processed_at = processed_at - ?", (hour,))
        conn.execute("UPDATE processed_clock SET now = now - ?", (hour,))
        conn.commit()
        stored = conn.execute("SELECT now FROM processed_clock").fetchone()[0]
        conn.close()

        d2 = FakeDaemon(self)
        c2 = quiet_client(d2, dedupe_retention=1800)
        stop2 = start(self, c2, handle, tx_db=self.path)
        d2.send(frame(fid="1", events=[event("a")]))  # the redelivery
        self.assertEqual(d2.ack()["frames"], [1])
        stop2()
        self.assertEqual(calls, ["a"])
        self.assertEqual(c2.stats.duplicates, 1)
        self.assertEqual(c2.stats.forgotten, 0)
        self.assertEqual(self.processed(), ["a"])
        conn = sqlite3.connect(self.path)
        now = conn.execute("SELECT now FROM processed_clock").fetchone()[0]
        conn.close()
        self.assertLess(now - stored, 60 * 10**9, "the clock jumped over the stop: it counts downtime")

    def test_connection_must_leave_transactions_to_the_client(self):
        conn = sqlite3.connect(self.path)
        self.addCleanup(conn.close)
        with self.assertRaisesRegex(ValueError, "isolation_level=None"):
            ip.Client().run_tx(conn, lambda conn, ev: None)


class CurveTest(unittest.TestCase):
    def test_keys_secure_both_sockets(self):
        server_public, server_secret = (k.decode() for k in zmq.curve_keypair())
        _, client_secret = (k.decode() for k in zmq.curve_keypair())
        d = FakeDaemon(self, curve_secret=server_secret)
        c = quiet_client(d, curve_server_key=server_public, curve_secret_key=client_secret)
        start(self, c, lambda ev: None)
        d.send(frame(fid="9"))
        self.assertEqual(d.ack()["frames"], [9])

    def test_wrong_server_key_fails_the_handshake(self):
        _, server_secret = (k.decode() for k in zmq.curve_keypair())
        other_public, _ = (k.decode() for k in zmq.curve_keypair())
        _, client_secret = (k.decode() for k in zmq.curve_keypair())
        d = FakeDaemon(self, curve_secret=server_secret)
        mon = d.pull.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH |
                                        zmq.EVENT_HANDSHAKE_SUCCEEDED)
        mon.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        self.addCleanup(mon.close, 0)
        c = quiet_client(d, curve_server_key=other_public, curve_secret_key=client_secret)
        start(self, c, lambda ev: None)
        from zmq.utils.monitor import recv_monitor_message
        ev = recv_monitor_message(mon)["event"]
        self.assertIn(ev, (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH))
        d.pull.disable_monitor()

    def test_key_checks_never_show_the_key(self):
        public, secret = (k.decode() for k in zmq.curve_keypair())
        bad = secret[:-1] + "~"
        for kw, want in [({"curve_server_key": public}, "curve secret key is required"),
                         ({"curve_secret_key": secret}, "curve server key is required"),
                         ({"curve_server_key": public, "curve_secret_key": bad}, "curve secret key: not a Z85 CURVE key: character 40"),
                         ({"curve_server_key": public[:39], "curve_secret_key": secret}, "curve server key: not a Z85 CURVE key: want 40")]:
            with self.subTest(want):
                with self.assertRaises(ValueError) as cm:
                    ip.Client(**kw)
                self.assertIn(want, str(cm.exception))
                self.assertNotIn(secret[:20], str(cm.exception))
        with self.assertRaisesRegex(ValueError, "more than 32 bits"):
            ip.check_curve_key("#" * 40)

    def test_read_curve_key(self):
        public, _ = (k.decode() for k in zmq.curve_keypair())
        dir = tempfile.mkdtemp()
        good = os.path.join(dir, "daemon.pub")
        with open(good, "w") as f:
            f.write(f"# the daemon\n\n  {public}\n")
        self.assertEqual(ip.read_curve_key(good), public)
        for name, text, want in [("two.pub", f"{public}\n{public}\n", "holds 2 keys"),
                                 ("none.pub", "# nothing\n", "holds 0 keys"),
                                 ("bad.pub", "#\nnot a key\n", "bad.pub:2: not a Z85 CURVE key")]:
            path = os.path.join(dir, name)
            with open(path, "w") as f:
                f.write(text)
            with self.subTest(name), self.assertRaisesRegex(ValueError, want):
                ip.read_curve_key(path)
        os.chmod(good, 0o644)
        with self.assertRaisesRegex(ValueError, "readable by every user"):
            ip.read_curve_secret(good)
        os.chmod(good, 0o600)
        self.assertEqual(ip.read_curve_secret(good), public)


class OptionsTest(unittest.TestCase):
    def test_bad_options_are_all_reported(self):
        with self.assertRaises(ValueError) as cm:
            ip.Client("tcp://x:1", "tcp://x:1", receive_hwm=-1, ack_flush_interval=-1)
        for want in ("must differ", "receive HWM", "ack flush interval"):
            self.assertIn(want, str(cm.exception))
