package jsonscan_test

import (
	"fmt"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

func ExampleObjectEach() {
	obj := []byte(`{"id": "caf\u00e9-1", "n": 42, "tags": ["a", "b"], "na\u006De": null}`)
	err := jsonscan.ObjectEach(obj, func(key []byte, plainKey bool, val []byte, kind jsonscan.Kind) error {
		name := string(key)
		if !plainKey {
			var err error
			if name, err = jsonscan.Unquote(key); err != nil {
				return err
			}
		}
		fmt.Printf("%s: %s %s\n", name, kind, val)
		return nil
	})
	fmt.Println(err)

	err = jsonscan.ObjectEach([]byte(`{"a": 1, "b": [1,]}`), func([]byte, bool, []byte, jsonscan.Kind) error { return nil })
	fmt.Println(err)
	// Output:
	// id: string caf\u00e9-1
	// n: number 42
	// tags: array ["a", "b"]
	// name: null null
	// <nil>
	// invalid character ']' looking for a value at offset 17
}

func ExampleDecoder() {
	data := []byte(`{"user": {"id": 7, "roles": ["admin", "dev"]}, "ignored": {"deep": [1, 2, 3]}}`)
	var d jsonscan.Decoder
	d.Reset(data)
	err := d.Object(func(key []byte, _ bool) error {
		if string(key) != "user" {
			return nil // left unread: the Decoder validates and skips it
		}
		return d.Object(func(key []byte, _ bool) error {
			switch string(key) {
			case "id":
				val, _, err := d.Value()
				fmt.Printf("id %s\n", val)
				return err
			case "roles":
				return d.Array(func() error {
					val, _, err := d.Value()
					fmt.Printf("role %s\n", val)
					return err
				})
			}
			return nil
		})
	})
	if err == nil {
		err = d.End()
	}
	fmt.Println(err)
	// Output:
	// id 7
	// role admin
	// role dev
	// <nil>
}
