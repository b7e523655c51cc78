package edge

import "github.com/ingestorhq/ingestor/internal/devicewire"

// envelope is one input item made into a ws_ingress envelope, ready to
// store.
type envelope struct {
	devicewire.Draft
	// raw is the envelope as stored (and sent), set by outbox.add: the
	// draft with the seq the outbox assigned when it NeedSeq.
	raw []byte
}

// parse makes item into an envelope with enc, or says why it is none;
// parent and state, when set, are the trace context it carries unless it
// has one of its own.
func parse(enc *devicewire.Encoder, item []byte, parent, state string) (*envelope, error) {
	d, err := enc.EncodeTraced(item, parent, state)
	if err != nil {
		return nil, err
	}
	return &envelope{Draft: d}, nil
}
