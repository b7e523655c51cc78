import ctypes
import ctypes.util
import resource
import unittest

from ingestor_processor import malloc, tune_malloc


def churn(libc, n, size):
    """Allocate, write and free 16 buffers of size bytes, n times, as libzmq does with a burst of messages."""
    for i in range(n):
        bufs = [libc.malloc(size) for _ in range(16)]
        for b in bufs:
            ctypes.memset(b, i & 0xFF, size)
        for b in bufs:
            libc.free(b)


def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class TuneMallocTest(unittest.TestCase):
    def test_operator_tunables_win(self):
        for env in ("glibc.malloc.trim_threshold=131072", "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=65536"):
            applied, reason = tune_malloc(env)
            self.assertFalse(applied, env)
            self.assertIn("GLIBC_TUNABLES", reason)

    def test_thresholds_stop_the_churn(self):
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        # glibc's defaults first, whatever the process set before.
        self.assertEqual(libc.mallopt(malloc._M_MMAP_THRESHOLD, 128 << 10), 1)
        self.assertEqual(libc.mallopt(malloc._M_TRIM_THRESHOLD, 128 << 10), 1)
        before = faults()
        churn(libc, 30, 300 << 10)
        untuned = faults() - before
        applied, reason = tune_malloc("")
        self.assertTrue(applied, reason)
        churn(libc, 1, 300 << 10)  # the first use of the heap faults it in once
        before = faults()
        churn(libc, 30, 300 << 10)
        tuned = faults() - before
        self.assertGreater(untuned, 30 * 50, "the churn tune_malloc prevents did not happen with glibc's defaults")
        self.assertLess(tuned, untuned / 20, f"{tuned} page faults tuned, {untuned} untuned")


if __name__ == "__main__":
    unittest.main()
