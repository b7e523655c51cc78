"""Tests of strict frame decoding and ack encoding."""

import json
import unittest

from ingestor_processor import MAX_REASON_BYTES, MalformedFrame, cut_reason, decode_frame, decode_frame_trusted, encode_ack


def event(key="k", payload='"payload":{"n":1}', extra=""):
    return ('{"key":"%s","source":"s","seq":7,"fetched_at":"2024-05-01T10:00:00Z",'
            '"raw":{"key":"s/r.json","off":0,"len":7},%s%s}' % (key, payload, extra))


def frame(head='"v":1,"type":"events"', fid="3", events=None):
    evs = ",".join(events if events is not None else [event()])
    return '{%s,"frame":%s,"delivery":2,"raw_store":"file:///r","events":[%s]}' % (head, fid, evs)


class DecodeFrameTest(unittest.TestCase):
    def test_valid(self):
        f = decode_frame([frame(events=[event("a"), event("b", '"payload_b64":"aGVsbG//d29yCg=="', ',"x":{"y":[1]}')])
                          .encode()])
        self.assertEqual((f.id, f.delivery, f.raw_store, len(f.events)), (3, 2, "file:///r", 2))
        a, b = f.events
        self.assertEqual((a.source, a.key, a.seq, a.is_json, a.payload), ("s", "a", 7, True, {"n": 1}))
        self.assertEqual((a.raw_key, a.raw_off, a.raw_len, a.fetched_at, a.event_time),
                         ("s/r.json", 0, 7, "2024-05-01T10:00:00Z", None))
        self.assertEqual((b.is_json, b.payload, b.payload_bytes, b.data()), (False, None, b"hello\xffwor\n", b"hello\xffwor\n"))
        self.assertEqual(a.data(), b'{"n":1}')

    def test_trace_context(self):
        tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        f = decode_frame([frame(events=[
            event("a", extra=',"traceparent":"%s","tracestate":"v=1"' % tp),
            event("b", extra=',"traceparent":"%s"' % tp),
            event("c"),
        ]).encode()])
        a, b, c = f.events
        self.assertEqual(a.trace_context(), {"traceparent": tp, "tracestate": "v=1"})
        self.assertEqual(b.trace_context(), {"traceparent": tp})
        self.assertEqual((c.traceparent, c.trace_context()), (None, {}))
        with self.assertRaises(MalformedFrame):
            decode_frame([frame(events=[event("d", extra=',"traceparent":7')]).encode()])

    def test_unknown_fields_and_null_payload(self):
        f = decode_frame([frame(head='"v":1,"type":"events","future":[{"a":1}]',
                                events=[event(payload='"payload":null')]).encode()])
        self.assertTrue(f.events[0].is_json)
        self.assertIsNone(f.events[0].payload)

    @staticmethod
    def malformed_cases():
        deep = "[" * 5000 + "]" * 5000
        return {
            "multi-part": [frame().encode(), frame().encode()],
            "zero parts": [],
            "byte-order mark": [("\ufeff" + frame()).encode()],
            "invalid UTF-8": [frame(events=[event(payload='"payload":"\xff"')]).encode("latin-1")],
            "not JSON": [b"not json"],
            "trailing data": [(frame() + "{}").encode()],
            "an array": [b"[1]"],
            "v true": [frame(head='"v":true,"type":"events"').encode()],
            "v 1.0": [frame(head='"v":1.0,"type":"events"').encode()],
            "v string": [frame(head='"v":"1","type":"events"').encode()],
            "v 2": [frame(head='"v":2,"type":"events"').encode()],
            "no v": [frame(head='"type":"events"').encode()],
            "type ack": [frame(head='"v":1,"type":"ack"').encode()],
            "frame 0": [frame(fid="0").encode()],
            "frame 1e3": [frame(fid="1e3").encode()],
            "frame too big": [frame(fid=str(2**63)).encode()],
            "events object": [b'{"v":1,"type":"events","frame":1,"events":{}}'],
            "event not object": [frame(events=["1"]).encode()],
            "no source": [frame(events=['{"key":"k","seq":1,"payload":1}']).encode()],
            "key number": [frame(events=['{"key":1,"source":"s","seq":1,"payload":1}']).encode()],
            "key lone surrogate": [frame(events=[event(key="\\ud800")]).encode()],
            "seq float": [frame(events=['{"key":"k","source":"s","seq":1.5,"payload":1}']).encode()],
            "both payloads": [frame(events=[event(payload='"payload":1,"payload_b64":"AA=="')]).encode()],
            "no payload": [frame(events=[event(payload='"x":1')]).encode()],
            "bad base64": [frame(events=[event(payload='"payload_b64":"%%%"')]).encode()],
            "unpadded base64": [frame(events=[event(payload='"payload_b64":"AA"')]).encode()],
            "NaN": [frame(events=[event(payload='"payload":NaN')]).encode()],
            "nested too deep": [frame(events=[event(payload='"payload":' + deep)]).encode()],
        }

    def test_malformed(self):
        for name, parts in self.malformed_cases().items():
            with self.subTest(name):
                with self.assertRaises(MalformedFrame):
                    decode_frame(parts)


def laid_out(key, payload, length=None, extra=""):
    """An event as the daemon's encoder lays it out, its raw.len the bytes
    of payload (JSON text) unless length is given."""
    n = len(payload.encode()) if length is None else length
    return ('{"key":"%s","source":"s","seq":7,"fetched_at":"2024-05-01T10:00:00Z"%s,'
            '"raw":{"key":"s/r.json","off":0,"len":%d},"payload":%s}' % (key, extra, n, payload))


def fields(f):
    return [(e.key, e.source, e.seq, e.fetched_at, e.event_time, e.raw_key, e.raw_off, e.raw_len, e.is_json,
             e.payload, e.payload_bytes, e.traceparent, e.tracestate) for e in f.events] + [f.id, f.delivery, f.raw_store]


class DecodeFrameTrustedTest(unittest.TestCase):
    # Payloads that would trip a decoder looking for the wrong bytes: the
    # name of the payload member inside a payload, multi-byte UTF-8 (raw.len
    # counts bytes), escaped quotes and backslashes, scalars.
    PAYLOADS = ['{"payload":{"payload":1},"x":",\\"payload\\":"}', '{"name":"Zoë ✓ 𝄞"}', '"say \\"hi\\" \\\\"',
                "[1,2,[3]]", "12.5e3", "-7", "true", "false", "null", '{}']

    def test_same_frame_as_decode_frame(self):
        tp = ',"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"v=1"'
        evs = [laid_out(f"k{i}", p) for i, p in enumerate(self.PAYLOADS)]
        evs.append(event("b64", '"payload_b64":"aGVsbG//d29yCg=="'))
        evs.append(laid_out("traced", '{"t":1}', extra=tp))
        msg = frame(events=evs).encode()
        strict, trusted = decode_frame([msg]), decode_frame_trusted([msg])
        self.assertEqual(fields(trusted), fields(strict))
        self.assertEqual([e._payload_json is not None for e in trusted.events], [True] * len(self.PAYLOADS) + [False, True],
                         "JSON payloads not taken by their length")
        for i, p in enumerate(self.PAYLOADS):
            # data() is the payload's bytes as sent, not a re-encoding.
            self.assertEqual(trusted.events[i].data(), p.encode())
        self.assertEqual(trusted.events[len(self.PAYLOADS)].data(), b"hello\xffwor\n")
        empty = frame(events=[]).encode()
        self.assertEqual(fields(decode_frame_trusted([empty])), fields(decode_frame([empty])))

    def test_payloads_are_parsed_when_read(self):
        msg = frame(events=[laid_out("bad", '{"a":[1,,2]}'), laid_out("comma", "[1,]"), laid_out("ok", '{"a":1}')]).encode()
        with self.assertRaises(MalformedFrame):
            decode_frame([msg])
        f = decode_frame_trusted([msg])
        bad, comma, ok = f.events
        self.assertEqual((bad.key, bad.data(), ok.payload), ("bad", b'{"a":[1,,2]}', {"a": 1}))
        for ev in (bad, comma):
            with self.subTest(ev.key), self.assertRaises(MalformedFrame):
                ev.payload
        ok.payload = ["replaced"]
        self.assertEqual((ok.payload, ok.data()), (["replaced"], b'["replaced"]'))

    def test_lengths_that_do_not_fit_fall_back(self):
        # Each raw.len is wrong: too short, too long, past the end, not a
        # number's worth. decode_frame's result, or its error, comes back.
        for name, ev in {
            "short": laid_out("a", '{"a":"bc"}', length=5),
            "long": laid_out("a", '{"a":1}', length=8),
            "past the end": laid_out("a", '{"a":1}', length=500),
            "zero": laid_out("a", "1", length=0),
            "negative": laid_out("a", "1", length=-1),
        }.items():
            with self.subTest(name):
                msg = frame(events=[ev, laid_out("b", '{"b":2}')]).encode()
                self.assertEqual(fields(decode_frame_trusted([msg])), fields(decode_frame([msg])))
        # A future daemon's layout: other order, whitespace, unknown fields.
        other = ('{ "events": [ {"payload": {"n": 1}, "raw": {"len": 8, "key": "r", "off": 0}, "seq": 1, "source": "s",'
                 ' "key": "k", "future": {"payload": 2}} ], "frame": 9, "type": "events", "v": 1 }').encode()
        self.assertEqual(fields(decode_frame_trusted([other])), fields(decode_frame([other])))

    def test_malformed_frames_are_malformed_trusted(self):
        for name, parts in DecodeFrameTest.malformed_cases().items():
            with self.subTest(name), self.assertRaises(MalformedFrame):
                decode_frame_trusted(parts)


class EncodeAckTest(unittest.TestCase):
    def test_fields(self):
        msg = json.loads(encode_ack([1, 2], [(3, "s", "é")], [(3, "s", "k", "bad", True), (4, "s", "k2", "", False)]))
        self.assertEqual(msg, {"v": 1, "type": "ack", "frames": [1, 2], "keys": [{"frame": 3, "source": "s", "key": "é"}],
                               "nacks": [{"frame": 3, "source": "s", "key": "k", "reason": "bad", "permanent": True},
                                         {"frame": 4, "source": "s", "key": "k2", "reason": ""}]})
        self.assertNotIn(b"frames", encode_ack(keys=[(1, "s", "k")]))
        with self.assertRaises(ValueError):
            encode_ack()

    def test_reason_cut_at_a_character_boundary(self):
        r = cut_reason("é" * 1000)  # 2000 bytes
        self.assertEqual(len(r.encode()), MAX_REASON_BYTES)
        r = cut_reason("x" + "€" * 400)  # 1 + 1200 bytes: cut inside a character
        self.assertEqual(r, "x" + "€" * 341)
        self.assertLessEqual(len(r.encode()), MAX_REASON_BYTES)
        self.assertEqual(cut_reason("short"), "short")
        self.assertEqual(cut_reason("\udcff"), "?")  # not encodable
