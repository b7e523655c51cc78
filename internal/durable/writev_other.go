//go:build !linux

package durable

import "os"

// WriteAt writes parts one after the other to f from offset off.
func WriteAt(f *os.File, parts [][]byte, off int64) error {
	for _, p := range parts {
		if _, err := f.WriteAt(p, off); err != nil {
			return err
		}
		off += int64(len(p))
	}
	return nil
}
