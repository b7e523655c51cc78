package actors

// malformedPages tracks a source's malformed answers: how often in a row
// the request (the cursor, which a malformed page does not move) came back
// malformed, and the dead letters that a later good fetch of the same
// request resolves.
type malformedPages struct {
	cursor string // the request of the current streak
	count  int    // malformed answers to cursor since its last success or dead letter
	dead   map[string]*deadRequest
}

// deadRequest is the state of the dead letters of one request.
type deadRequest struct {
	pending   int  // dead letters sent to PersistRaw and not yet answered
	succeeded bool // a later fetch of the request succeeded
}

// malformed counts a malformed answer to cursor. It returns the attempt
// number in the streak and whether to dead-letter the payload: after more
// than retries malformed answers in a row, which also starts a new streak.
func (m *malformedPages) malformed(cursor string, retries int) (int, bool) {
	if cursor != m.cursor {
		m.cursor, m.count = cursor, 0
	}
	m.count++
	attempt := m.count
	if attempt <= retries {
		return attempt, false
	}
	m.count = 0
	if m.dead == nil {
		m.dead = make(map[string]*deadRequest)
	}
	d := m.dead[cursor]
	if d == nil {
		d = &deadRequest{}
		m.dead[cursor] = d
	}
	d.pending++
	d.succeeded = false
	return attempt, true
}

// succeeded notes a good answer to cursor, which ends any streak. It
// reports whether cursor's dead letters are to be resolved now; if one is
// still on its way to the list, listed reports it when it arrives.
func (m *malformedPages) succeeded(cursor string) bool {
	m.cursor, m.count = "", 0
	d, ok := m.dead[cursor]
	if !ok {
		return false
	}
	d.succeeded = true
	return m.settle(cursor, d)
}

// listed notes that a dead letter of cursor is recorded (or given up at
// shutdown), and reports whether cursor's dead letters are to be resolved
// now.
func (m *malformedPages) listed(cursor string) bool {
	d, ok := m.dead[cursor]
	if !ok {
		return false
	}
	d.pending--
	return m.settle(cursor, d)
}

// settle forgets cursor once its dead letters are all recorded and a
// later fetch of it succeeded, reporting whether it did.
func (m *malformedPages) settle(cursor string, d *deadRequest) bool {
	if d.pending > 0 || !d.succeeded {
		return false
	}
	delete(m.dead, cursor)
	return true
}
