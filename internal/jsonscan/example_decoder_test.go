package jsonscan_test

import (
	"fmt"

	"github.com/ingestorhq/ingestor/internal/jsonscan"
)

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
