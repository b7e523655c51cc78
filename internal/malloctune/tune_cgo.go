//go:build linux && cgo

package malloctune

/*
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

static int malloctune_set(int trim, int mmap_threshold) {
#ifdef __GLIBC__
	// M_TRIM_THRESHOLD also turns off glibc's dynamic thresholds, which
	// would otherwise keep the mmap threshold where it was set.
	return mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 && mallopt(M_TRIM_THRESHOLD, trim) == 1;
#else
	return 0;
#endif
}

// malloctune_probe mallocs and frees size bytes, touching them, and
// reports whether they were mapped on their own and whether the arenas
// kept them after the free (-1 for both without glibc 2.33 or later).
static void malloctune_probe(size_t size, int *mapped, int *kept) {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 33)
	struct mallinfo2 before = mallinfo2();
	volatile char *p = malloc(size);
	for (size_t i = 0; i < size; i += 4096) p[i] = 1;
	struct mallinfo2 during = mallinfo2();
	free((void *)p);
	struct mallinfo2 after = mallinfo2();
	*mapped = during.hblkhd > before.hblkhd;
	*kept = after.arena >= during.arena && during.arena > 0;
#else
	*mapped = -1;
	*kept = -1;
#endif
}
*/
import "C"

func tune(trim, mmapThreshold int) bool {
	return C.malloctune_set(C.int(trim), C.int(mmapThreshold)) == 1
}

// probe mallocs, touches and frees size bytes in C: mapped reports whether
// they were mapped on their own, kept whether the arenas still hold them
// after the free; ok is false where glibc cannot tell. For the tests.
func probe(size int) (mapped, kept, ok bool) {
	var m, k C.int
	C.malloctune_probe(C.size_t(size), &m, &k)
	return m == 1, k == 1, m >= 0
}
