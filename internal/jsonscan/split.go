package jsonscan

// Span locates one array element: body[Off : Off+Len].
type Span struct {
	// Off is the offset of the element's first byte.
	Off int
	// Len is the element's length in bytes, without surrounding whitespace.
	Len int
}

// SplitArray validates that body is one JSON array, with optional
// whitespace around it, and returns the span of each element in order. An
// empty array yields no spans. Anything else (another kind of value,
// truncated or malformed JSON, trailing data) yields a *SyntaxError with the
// offset of the problem.
func SplitArray(body []byte) ([]Span, error) {
	i := skipSpace(body, 0)
	if i >= len(body) {
		return nil, syntaxErr(i, "no JSON value, expected an array")
	}
	if body[i] != '[' {
		return nil, syntaxErr(i, "not a JSON array (found "+describe(body[i])+")")
	}
	i = skipSpace(body, i+1)
	var spans []Span
	if i < len(body) && body[i] == ']' {
		i++
	} else {
		for {
			end, err := skipValue(body, i, 1)
			if err != nil {
				return nil, err
			}
			spans = append(spans, Span{Off: i, Len: end - i})
			i = skipSpace(body, end)
			if i >= len(body) {
				return nil, eofErr(i)
			}
			if body[i] == ']' {
				i++
				break
			}
			if body[i] != ',' {
				return nil, syntaxErr(i, "expected ',' or ']' after array element")
			}
			i = skipSpace(body, i+1)
		}
	}
	if i = skipSpace(body, i); i != len(body) {
		return nil, syntaxErr(i, "unexpected data after the array")
	}
	return spans, nil
}
