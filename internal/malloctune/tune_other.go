//go:build !linux || !cgo

package malloctune

func tune(trim, mmapThreshold int) bool { return false }

func probe(size int) (mapped, kept, ok bool) { return false, false, false }
