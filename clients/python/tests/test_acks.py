"""Tests of ack batching."""

import json
import unittest

from ingestor_processor import MAX_BATCH_BYTES, MAX_BATCH_FRAMES, MAX_BATCH_KEYS, AckBatch
from ingestor_processor.acks import FrameResult


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class AckBatchTest(unittest.TestCase):
    def test_whole_frames_keys_and_nacks(self):
        b = AckBatch()
        self.assertTrue(b.empty())
        b.add(FrameResult(1, 10, True))
        b.add(FrameResult(2, 3, False, [("s", "a"), ("s", "b")], [("s", "c", "boom", True)]))
        self.assertEqual((b.events, b.frame_count()), (12, 3))
        msg = json.loads(b.encode())
        self.assertEqual(msg["frames"], [1])
        self.assertEqual(msg["keys"], [{"frame": 2, "source": "s", "key": "a"}, {"frame": 2, "source": "s", "key": "b"}])
        self.assertEqual(msg["nacks"], [{"frame": 2, "source": "s", "key": "c", "reason": "boom", "permanent": True}])
        b.reset()
        self.assertTrue(b.empty())
        self.assertEqual(b.events, 0)

    def test_full_by_frames(self):
        b = AckBatch()
        for i in range(1, MAX_BATCH_FRAMES):
            b.add(FrameResult(i, 1, True))
            self.assertFalse(b.full())
        b.add(FrameResult(MAX_BATCH_FRAMES, 1, True))
        self.assertTrue(b.full())

    def test_full_by_keys(self):
        b = AckBatch()
        b.add(FrameResult(1, MAX_BATCH_KEYS, False, [("s", str(i)) for i in range(MAX_BATCH_KEYS - 1)]))
        self.assertFalse(b.full())
        b.add(FrameResult(2, 1, False, [], [("s", "x", "", False)]))
        self.assertTrue(b.full())

    def test_full_by_bytes(self):
        # Long reasons in a failure storm: the batch is sent long before
        # the daemon's 1 MiB minimum message limit.
        b = AckBatch()
        n = 0
        while not b.full():
            n += 1
            b.add(FrameResult(n, 100, False, [], [("s", "k%d" % i, "é" * 5000, False) for i in range(100)]))
        self.assertGreaterEqual(b.bytes, MAX_BATCH_BYTES)
        self.assertLess(b.frame_count(), MAX_BATCH_FRAMES)
        self.assertLess(len(b.nacks), MAX_BATCH_KEYS)
        self.assertLess(len(b.encode()), 1 << 20)

    def test_due(self):
        clock = Clock()
        b = AckBatch(clock)
        self.assertFalse(b.due(0.02))
        b.add(FrameResult(1, 1, True))
        clock.now += 0.019
        self.assertFalse(b.due(0.02))
        b.add(FrameResult(2, 1, True))  # the oldest entry counts
        clock.now += 0.001
        self.assertTrue(b.due(0.02))
