package queue

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ingestorhq/ingestor/internal/powercut"
)

// childQueueEnv names the queue file TestQueueWriterChild writes to; the
// test runs only as the child of the power-cut tests. childSyncEnv makes
// it wait for the writer's next fsync of the WAL before "ready";
// childFullEnv opens the queue with synchronous = full.
// childHoldEnv makes it append a sixth batch as the push inbox does
// and print "ready" from between that commit and the writer's WAL sync,
// where it stays; childReopenEnv makes it commit nothing, only open the
// queue and print the frames the sender's backlog scan lists.
const (
	childQueueEnv  = "INGESTOR_QUEUE_CHILD_DB"
	childSyncEnv   = "INGESTOR_QUEUE_CHILD_SYNC"
	childFullEnv   = "INGESTOR_QUEUE_CHILD_FULL"
	childHoldEnv   = "INGESTOR_QUEUE_CHILD_HOLD"
	childReopenEnv = "INGESTOR_QUEUE_CHILD_REOPEN"
)

// TestQueueWriterChild, run as a child process, opens the queue in
// $INGESTOR_QUEUE_CHILD_DB with synchronous = normal (full if
// $INGESTOR_QUEUE_CHILD_FULL is set), commits five
// batches, prints their frame ids, waits for an fsync of the WAL after
// them if $INGESTOR_QUEUE_CHILD_SYNC is set, prints "ready", and waits to
// be killed.
func TestQueueWriterChild(t *testing.T) {
	path := os.Getenv(childQueueEnv)
	if path == "" {
		return // not the child: nothing to do
	}
	sync := "normal"
	if os.Getenv(childFullEnv) != "" {
		sync = "full"
	}
	q, err := Open(Options{Path: path, Synchronous: sync, EventsPerFrame: 2})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	if os.Getenv(childReopenEnv) != "" {
		ids, err := q.FramesAfter(context.Background(), 0, 100)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		for _, id := range ids {
			fmt.Println(id)
		}
		fmt.Println("ready")
		select {} // killed by the parent
	}
	for i := range 5 {
		frames, err := q.Append(context.Background(), powerCutBatch(fmt.Sprintf("before-%d", i)))
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		for _, f := range frames {
			fmt.Println(f.ID)
		}
	}
	if os.Getenv(childSyncEnv) != "" {
		deadline := time.Now().Add(30 * normalSyncInterval)
		for synced := q.walSyncs.Load(); q.walSyncs.Load() == synced; {
			if time.Now().After(deadline) {
				fmt.Println("error: the writer did not fsync the WAL within", 30*normalSyncInterval)
				os.Exit(1)
			}
			time.Sleep(10 * time.Millisecond) // the poll step: the fsync comes within normalSyncInterval
		}
	}
	if os.Getenv(childHoldEnv) != "" {
		beforeWALSync = func() {
			fmt.Println("ready")
			select {} // killed by the parent between the commit and its sync
		}
		_, err := pushAppend(context.Background(), q, powerCutBatch("held"))
		fmt.Println("error: the push append returned:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	select {} // killed by the parent
}

func powerCutBatch(key string) Batch {
	return Batch{Source: "s", FetchedAt: time.Now(), RawKey: "s/" + key,
		Events: []NewEvent{{Key: key + "-a", RawLen: 1}, {Key: key + "-b", RawLen: 1}}}
}

// TestNormalModeNeverReusesFrameIDs: with synchronous = normal a power
// cut takes the commits since the WAL's last fsync, frame ids included,
// while a processor may still hold acks of those frames in its socket. A
// frame committed after the restart must not get one of those ids, or
// such a stale whole-frame ack would clear it unread. A child process
// commits frames on the power-cut file system; the power is cut; the queue reopened here
// commits a frame whose id must be new.
func TestNormalModeNeverReusesFrameIDs(t *testing.T) {
	fs := powercut.NewDisk(t)
	path := filepath.Join(fs.Dir, "queue.db")
	before := cutAfterChildCommits(t, fs, path)

	q := openAfterCut(t, path)
	pending := q.PendingFrames()
	frames, err := q.Append(t.Context(), powerCutBatch("after"))
	if err != nil {
		t.Fatal(err)
	}
	var reused []string
	for _, f := range frames {
		if before[f.ID] {
			reused = append(reused, strconv.FormatInt(f.ID, 10))
		}
	}
	if len(reused) > 0 {
		t.Errorf("frame id %s, given before the power cut, was given again after it (%d of the 5 frames survived the cut)",
			strings.Join(reused, ", "), pending)
	}
	t.Logf("%d of 5 frames survived the cut; the next frame id is %d", pending, frames[0].ID)
}

// TestNormalModeLosesAtMostTheLastSecond: with synchronous = normal the
// writer fsyncs the WAL within normalSyncInterval of a commit, so commits
// that old survive a power cut (SQLite alone syncs only at a checkpoint,
// and every one was lost).
func TestNormalModeLosesAtMostTheLastSecond(t *testing.T) {
	fs := powercut.NewDisk(t)
	path := filepath.Join(fs.Dir, "queue.db")
	cutAfterChildCommits(t, fs, path, childSyncEnv+"=1")
	q := openAfterCut(t, path)
	if n := q.PendingFrames(); n != 5 {
		t.Errorf("%d of the 5 frames committed before the WAL's fsync survived the power cut", n)
	}
}

// TestFirstCommitsSurviveAPowerCut: with synchronous = full a commit is
// durable when Append returns, the first ones of a new queue too, whose
// file and directory entry SQLite had just created. A child process
// creates the queue in a new directory, commits five frames and is
// frozen; after the power cut all five are there.
func TestFirstCommitsSurviveAPowerCut(t *testing.T) {
	fs := powercut.NewDisk(t)
	path := filepath.Join(fs.Dir, "data", "queue.db")
	if err := os.Mkdir(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := syncDir(fs.Dir); err != nil {
		t.Fatal(err)
	}
	cutAfterChildCommits(t, fs, path, childFullEnv+"=1")
	q := openAfterCut(t, path)
	if n := q.PendingFrames(); n != 5 {
		t.Errorf("%d of the 5 frames committed with synchronous = full survived the power cut", n)
	}
}

// syncDir fsyncs the directory dir.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// TestAFrameSeenAfterAKillSurvivesAPowerCut: a push group's commit is
// on disk only once the writer has synced the WAL after it. A process
// killed in between leaves the commit in the page cache alone, and the
// next process to open the queue would list its frame to the sender: a
// frame sent, acked and then taken by a power cut would have its id
// given again, and the stale ack would clear the new frame unread. So the
// queue syncs the WAL when it opens (syncAtOpen), before anything is
// read. One child commits five frames and is killed between a push
// group's commit and its sync; a second opens the queue and lists the
// frames; the power is cut; every frame it listed is there.
func TestAFrameSeenAfterAKillSurvivesAPowerCut(t *testing.T) {
	fs := powercut.NewDisk(t)
	path := filepath.Join(fs.Dir, "queue.db")
	before, held := runQueueChild(t, path, childFullEnv+"=1", childHoldEnv+"=1")
	if len(before) != 5 {
		t.Fatalf("the first child committed %d frames, want 5", len(before))
	}
	kill(t, held)
	seen, reader := runQueueChild(t, path, childFullEnv+"=1", childReopenEnv+"=1")
	if len(seen) != 6 {
		t.Fatalf("the second child listed %d frames, want the 5 and the held group's: the test would show nothing", len(seen))
	}
	fs.PowerCut(func() { kill(t, reader) })
	q := openAfterCut(t, path)
	ids, err := q.FramesAfter(t.Context(), 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	after := map[int64]bool{}
	for _, id := range ids {
		after[id] = true
	}
	for id := range seen {
		if !after[id] {
			t.Errorf("frame %d, listed to the sender after the kill, is gone after the power cut (%d of %d left)", id, len(after), len(seen))
		}
	}
}

// kill kills child and reaps it.
func kill(t *testing.T, child *exec.Cmd) {
	t.Helper()
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait() // killed: its status is the signal
}

// cutAfterChildCommits runs TestQueueWriterChild on the queue at path in
// fs with the extra environment env, cuts the power once it is ready,
// and returns the ids of the frames it committed.
func cutAfterChildCommits(t *testing.T, fs *powercut.Disk, path string, env ...string) map[int64]bool {
	t.Helper()
	before, child := runQueueChild(t, path, env...)
	if len(before) != 5 {
		t.Fatalf("the child committed %d frames, want 5", len(before))
	}
	// The child is idle (its commits returned): nothing writes during the
	// drop, and the kill leaves no file open.
	fs.PowerCut(func() { kill(t, child) })
	return before
}

// runQueueChild runs TestQueueWriterChild on the queue at path with the
// extra environment env until it is ready, and returns the frame ids it
// printed and the child, which runs until the test kills it or ends.
func runQueueChild(t *testing.T, path string, env ...string) (map[int64]bool, *exec.Cmd) {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^TestQueueWriterChild$", "-test.count=1")
	child.Env = append(append(os.Environ(), childQueueEnv+"="+path), env...)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if child.ProcessState == nil {
			_ = child.Process.Kill()
			_ = child.Wait() // killed: its status is the signal
		}
	})
	before := map[int64]bool{}
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		line := lines.Text()
		if line == "ready" {
			break
		}
		id, err := strconv.ParseInt(line, 10, 64)
		if err != nil {
			t.Fatalf("child: %s", line)
		}
		before[id] = true
	}
	if err := lines.Err(); err != nil {
		t.Fatalf("child: %v", err)
	}
	return before, child
}

// openAfterCut opens the queue at path with synchronous = normal, as the
// daemon does after the power came back, until the test ends.
func openAfterCut(t *testing.T, path string) *Queue {
	t.Helper()
	q, err := Open(Options{Path: path, Synchronous: "normal", EventsPerFrame: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := q.Close(); err != nil {
			t.Error(err)
		}
	})
	return q
}
