package jsonscan_test

import (
	"fmt"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

func Example() {
	body := []byte(`[
		{"id": "caf\u00e9-1", "meta": {"updated_at": "2024-05-01T10:00:00Z"}},
		{"id": 42, "meta": {}}
	]`)
	spans, err := jsonscan.SplitArray(body)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range spans {
		rec := body[s.Off : s.Off+s.Len]
		id, kind, _ := jsonscan.Field(rec, "id")
		if kind == jsonscan.String {
			text, err := jsonscan.Unquote(id)
			if err != nil {
				fmt.Println(err)
				return
			}
			fmt.Printf("id %s %q", kind, text)
		} else {
			fmt.Printf("id %s %s", kind, id)
		}
		if ts, _, ok := jsonscan.Field(rec, "meta.updated_at"); ok {
			fmt.Printf(", updated %s", ts)
		}
		fmt.Println()
	}

	_, err = jsonscan.SplitArray([]byte(`[{"oops": `))
	fmt.Println(err)
	// Output:
	// id string "café-1", updated 2024-05-01T10:00:00Z
	// id number 42
	// unexpected end of input at offset 10
}
