// Package jsonscan finds records and fields in JSON payloads without decoding
// them: SplitArray validates a JSON array and returns the byte span of each
// element, and Field walks one record to the raw bytes of a dotted path.
// A Decoder validates an object or an array while handing over each member
// or element, for a caller that descends into nested values, still in a
// single pass.
//
// Parsing is the hot path of every source, so SplitArray and Field build no
// maps, allocate nothing per value and never re-encode: a record's bytes go
// downstream exactly as the upstream sent them, and only the few fields a
// source needs are looked at. Unquote allocates the one string it returns.
//
// The accepted syntax is exactly what encoding/json.Valid accepts (RFC 8259;
// the bytes of strings are not checked for valid UTF-8; nesting at most
// 10000 deep), and Unquote decodes a string to the same text encoding/json
// would produce.
package jsonscan
