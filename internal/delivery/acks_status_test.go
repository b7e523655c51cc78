package delivery

import (
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/testsync"
)

func TestAckReceiverCountsProcessorConnections(t *testing.T) {
	r := newAckRig(t, "tcp://127.0.0.1:*", 0)
	if !r.recv.LastAck().IsZero() {
		t.Fatal("LastAck is set before any ack arrived")
	}
	r.start()
	before := time.Now()
	r.sync(t)
	if last := r.recv.LastAck(); last.Before(before) {
		t.Fatalf("LastAck = %v after an ack sent at %v", last, before)
	}
	testsync.WaitFor(t, "the rig's processor to be counted", 20*time.Second, func() bool { return r.recv.Connected() == 1 })
	endpoint, err := r.recv.sock.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	second, err := r.zctx.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := second.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	testsync.WaitFor(t, "a second processor to be counted", 20*time.Second, func() bool { return r.recv.Connected() == 2 })
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	testsync.WaitFor(t, "the second processor's disconnection to be counted", 20*time.Second, func() bool { return r.recv.Connected() == 1 })
}
