package wire

import (
	"encoding/json"
	"fmt"
)

// decodeFrameStd is the encoding/json implementation DecodeFrame replaced,
// kept as the reference for FuzzDecodeFrame and the benchmarks.
func decodeFrameStd(data []byte) (*Frame, error) {
	var f Frame
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("decode frame: %w", err)
	}
	if f.V != Version {
		return nil, fmt.Errorf("decode frame: unsupported version %d (want %d)", f.V, Version)
	}
	if f.Type != TypeEvents {
		return nil, fmt.Errorf("decode frame: unexpected type %q", f.Type)
	}
	return &f, nil
}
