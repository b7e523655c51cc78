package wire

import "encoding/base64"

func appendBase64(b, src []byte) []byte {
	n := base64.StdEncoding.EncodedLen(len(src))
	start := len(b)
	b = append(b, make([]byte, n)...)
	base64.StdEncoding.Encode(b[start:], src)
	return b
}
