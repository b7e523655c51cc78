//go:build linux

package processor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/wire"
)

// benchEventsPerFrame is the daemon's default publish.events_per_frame.
const benchEventsPerFrame = 100

// benchWindow is the most frames the bench daemon has unacked, the
// daemon's default publish.max_inflight_frames.
var benchWindow = config.Default().Publish.MaxInflightFrames

// BenchmarkRun measures what a processor spends per event on the real
// path: a stand-in daemon sends frames of 100 events of about 500 B,
// encoded with wire.Encoder as the daemon's sender encodes them, over a
// real ZeroMQ PUSH socket with the daemon's in-flight window; Run
// receives them, decodes them, calls a trivial Handler and sends its acks
// back over the real ack socket, which the stand-in decodes with
// wire.DecodeAck. One op is one event.
//
// Besides ns/op it reports cpu-ns/event, the CPU of the whole process,
// and proc-cpu-ns/event, the same without the stand-in daemon's threads
// (its sending and ack-reading goroutines, each locked to its thread, and
// its ZeroMQ context's own threads): what a processor in its own process
// spends, Go runtime included; proc-zmq-cpu-ns/event is the part of it
// spent in the threads of Run's own ZeroMQ context. acks/frame is the
// number of ack messages per frame.
func BenchmarkRun(b *testing.B) {
	d := startBenchDaemon(b)
	var handled atomic.Int64
	c, err := New(Options{Endpoint: d.endpoint, AckEndpoint: d.ackEndpoint,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(_ context.Context, ev *Event) error {
			if len(ev.Data()) == 0 {
				return fmt.Errorf("event %s/%s has no payload", ev.Source, ev.Key)
			}
			handled.Add(1)
			return nil
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("Run: %v", err)
		}
	}()
	// One frame first, so that both connections are up before the clock
	// starts, and Run's ZeroMQ threads are there to be found.
	d.run(b, benchEventsPerFrame)
	daemonThreads := make(map[int]bool)
	for _, tid := range d.tids {
		daemonThreads[tid] = true
	}
	procZMQ := newZMQThreads(b, daemonThreads)
	zmqCPU := func() time.Duration {
		var sum time.Duration
		for _, tid := range procZMQ {
			sum += threadCPU(b, tid)
		}
		return sum
	}
	handled.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, daemon0, zmq0 := processCPU(b), d.cpu(b), zmqCPU()
	msgs := d.run(b, b.N)
	cpu, daemon, zmq := processCPU(b)-cpu0, d.cpu(b)-daemon0, zmqCPU()-zmq0
	b.StopTimer()
	if n := handled.Load(); n != int64(b.N) {
		b.Fatalf("handler called %d times, want %d", n, b.N)
	}
	frames := (b.N + benchEventsPerFrame - 1) / benchEventsPerFrame
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/event")
	b.ReportMetric(float64((cpu-daemon).Nanoseconds())/float64(b.N), "proc-cpu-ns/event")
	b.ReportMetric(float64(zmq.Nanoseconds())/float64(b.N), "proc-zmq-cpu-ns/event")
	b.ReportMetric(float64(msgs)/float64(frames), "acks/frame")
}

// benchDaemon is the stand-in daemon of BenchmarkRun. Its sockets live on
// two goroutines, each locked to its OS thread so that their CPU can be
// told apart from the processor's.
type benchDaemon struct {
	endpoint, ackEndpoint string
	// send asks the sender for that many events, and expect tells the ack
	// reader how many frames they make; acked answers with the number of
	// ack messages that settled them, or -1 on an error, which failed
	// holds.
	send, expect, acked chan int
	failed              atomic.Pointer[error]
	// tids are the threads of the sender, the ack reader and the ZeroMQ
	// context.
	tids []int
}

// startBenchDaemon binds the stand-in daemon's sockets and starts its
// goroutines; they stop at the end of the benchmark.
func startBenchDaemon(b *testing.B) *benchDaemon {
	zmqBefore := zmqThreads(b)
	zctx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	d := &benchDaemon{send: make(chan int), expect: make(chan int), acked: make(chan int)}
	window := make(chan struct{}, benchWindow)
	stop := make(chan struct{})
	type started struct {
		typ      zmq.Type
		tid      int
		endpoint string
		err      error
	}
	ready := make(chan started)
	exited := make(chan struct{}, 2)
	bind := func(typ zmq.Type) (*zmq.Socket, string, error) {
		s, err := zctx.NewSocket(typ)
		if err != nil {
			return nil, "", err
		}
		if err := s.SetLinger(0); err != nil {
			return nil, "", err
		}
		if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
			return nil, "", err
		}
		ep, err := s.GetLastEndpoint()
		return s, ep, err
	}
	// The sender encodes and sends frames as the daemon's sender does,
	// each taking a place in the window until it is acked.
	evs, payloads := benchEvents()
	go func() {
		defer func() { exited <- struct{}{} }()
		runtime.LockOSThread()
		s, ep, err := bind(zmq.PUSH)
		ready <- started{zmq.PUSH, syscall.Gettid(), ep, err}
		if err != nil {
			return
		}
		defer s.Close()
		var enc wire.Encoder
		var id int64
		for {
			var n int
			select {
			case n = <-d.send:
			case <-stop:
				return
			}
			for n > 0 {
				window <- struct{}{}
				id++
				enc.Begin(id, 1, "s3://ingest-raw/prod")
				for i := range min(n, benchEventsPerFrame) {
					ev := &evs[int(id%benchKeyFrames)*benchEventsPerFrame+i]
					enc.Add(ev, payloads[i], true)
				}
				n -= benchEventsPerFrame
				if _, err := s.SendBytes(enc.End(), 0); err != nil {
					d.fail(fmt.Errorf("bench daemon: send frame %d: %w", id, err), stop)
					return
				}
			}
		}
	}()
	// The ack reader counts the frames acked whole; any other ack is an
	// error, the Handler failing nothing.
	go func() {
		defer func() { exited <- struct{}{} }()
		runtime.LockOSThread()
		s, ep, err := bind(zmq.PULL)
		ready <- started{zmq.PULL, syscall.Gettid(), ep, err}
		if err != nil {
			return
		}
		defer s.Close()
		poller := zmq.NewPoller()
		poller.Add(s, zmq.POLLIN)
		want, frames, msgs := 0, 0, 0
		fail := func(err error) { d.fail(err, stop) }
		for {
			if want == 0 {
				select {
				case want = <-d.expect:
				case <-stop:
					return
				}
			}
			polled, err := poller.Poll(100 * time.Millisecond)
			if err != nil {
				fail(fmt.Errorf("bench daemon: poll acks: %w", err))
				return
			}
			if len(polled) == 0 {
				select {
				case <-stop:
					return
				default:
					continue
				}
			}
			data, err := s.RecvBytes(0)
			if err != nil {
				fail(fmt.Errorf("bench daemon: receive ack: %w", err))
				return
			}
			a, err := wire.DecodeAck(data)
			if err != nil {
				fail(fmt.Errorf("bench daemon: ack %q: %w", data, err))
				return
			}
			if len(a.Keys) > 0 || len(a.Nacks) > 0 {
				fail(fmt.Errorf("bench daemon: ack %q acks single events", data))
				return
			}
			msgs++
			frames += len(a.Frames)
			for range a.Frames {
				<-window
			}
			if frames >= want {
				select {
				case d.acked <- msgs:
				case <-stop:
					return
				}
				want, frames, msgs = 0, 0, 0
			}
		}
	}()
	for range 2 {
		s := <-ready
		if s.err != nil {
			b.Fatalf("bench daemon: bind: %v", s.err)
		}
		d.tids = append(d.tids, s.tid)
		if s.typ == zmq.PUSH {
			d.endpoint = s.endpoint
		} else {
			d.ackEndpoint = s.endpoint
		}
	}
	d.tids = append(d.tids, newZMQThreads(b, zmqBefore)...)
	b.Cleanup(func() {
		close(stop)
		<-exited
		<-exited
		if err := zctx.Term(); err != nil {
			b.Errorf("bench daemon: terminate ZeroMQ context: %v", err)
		}
	})
	return d
}

// benchKeyFrames is how many frames of distinct keys the stand-in daemon
// cycles through.
const benchKeyFrames = 1000

// benchEvents returns benchKeyFrames frames' worth of events with
// distinct keys, and the payloads of one frame, about 500 B each.
func benchEvents() ([]wire.Event, [][]byte) {
	fetched := time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)
	evs := make([]wire.Event, benchKeyFrames*benchEventsPerFrame)
	for i := range evs {
		evs[i] = wire.Event{
			Key:       fmt.Sprintf("evt-%08d", i),
			Source:    "github",
			Seq:       int64(1_000_000 + i),
			FetchedAt: fetched,
			EventTime: fetched.Add(-time.Duration(i) * time.Second),
			Raw:       wire.RawRef{Key: "github/2024/05/01/100000-000042.json", Off: i % benchEventsPerFrame * 500, Len: 500},
		}
	}
	payloads := make([][]byte, benchEventsPerFrame)
	for i := range payloads {
		payloads[i] = benchPayload(i)
	}
	for i := range evs {
		// As in a daemon's frame: the payload is the raw bytes [off, off+len).
		evs[i].Raw.Len = len(payloads[i%benchEventsPerFrame])
	}
	return evs, payloads
}

// fail records err as the stand-in daemon's failure and tells run, unless
// the benchmark is over.
func (d *benchDaemon) fail(err error, stop <-chan struct{}) {
	if d.failed.CompareAndSwap(nil, &err) {
		select {
		case d.acked <- -1:
		case <-stop:
		}
	}
}

// run has the stand-in daemon send n events and waits until they are all
// acked; it returns the number of ack messages that acked them.
func (d *benchDaemon) run(b *testing.B, n int) int {
	d.expect <- (n + benchEventsPerFrame - 1) / benchEventsPerFrame
	d.send <- n
	msgs := <-d.acked
	if msgs < 0 {
		b.Fatal(*d.failed.Load())
	}
	return msgs
}

// cpu returns the CPU time the stand-in daemon's threads used so far.
func (d *benchDaemon) cpu(b *testing.B) time.Duration {
	var sum time.Duration
	for _, tid := range d.tids {
		sum += threadCPU(b, tid)
	}
	return sum
}

// processCPU returns the CPU time the process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTick is the unit of the CPU times in /proc/PID/task/TID/stat:
// USER_HZ, 100 on Linux.
const clockTick = 10 * time.Millisecond

// threadCPU returns the CPU time thread tid of the process used so far,
// from /proc.
func threadCPU(b *testing.B, tid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stat", tid))
	if err != nil {
		b.Fatalf("thread CPU: %v", err)
	}
	// The fields after the command's closing parenthesis start with the
	// third, the state; utime and stime are the 14th and the 15th.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("thread CPU: %s: bad utime or stime", data)
	}
	return time.Duration(utime+stime) * clockTick
}

// zmqThreads returns the process's threads that libzmq started (it names
// them ZMQbg/...).
func zmqThreads(b *testing.B) map[int]bool {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		b.Fatalf("list threads: %v", err)
	}
	found := make(map[int]bool)
	for _, t := range tasks {
		comm, err := os.ReadFile("/proc/self/task/" + t.Name() + "/comm")
		if err != nil {
			continue // the thread ended
		}
		if strings.HasPrefix(string(comm), "ZMQbg/") {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				b.Fatalf("thread id %q: %v", t.Name(), err)
			}
			found[tid] = true
		}
	}
	return found
}

// newZMQThreads returns libzmq's threads that are not in before (a set of
// thread ids).
func newZMQThreads(b *testing.B, before map[int]bool) []int {
	var tids []int
	for tid := range zmqThreads(b) {
		if !before[tid] {
			tids = append(tids, tid)
		}
	}
	if len(tids) == 0 {
		b.Fatal("no ZeroMQ threads found for the bench daemon")
	}
	return tids
}
