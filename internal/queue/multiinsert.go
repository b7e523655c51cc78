package queue

import (
	"database/sql"
	"fmt"
	"strings"
)

// maxInsertRows is the most rows one prepared multiInsert statement takes.
const maxInsertRows = 512

// multiInsert inserts rows of one table by statements of 1, 2, 4 ...
// maxInsertRows rows, prepared once on the writer's connection: a group's
// rows go in two or three statements, not one per row (each statement and
// each bind is a cgo call).
type multiInsert struct {
	what  string
	cols  int
	stmts map[int]*sql.Stmt
}

// prepareMultiInsert prepares the inserts of head ("INSERT INTO t(a, b)
// VALUES ") with cols columns, before the writer starts.
func prepareMultiInsert(db *sql.DB, what, head string, cols int) (*multiInsert, error) {
	m := &multiInsert{what: what, cols: cols, stmts: make(map[int]*sql.Stmt)}
	row := "(" + strings.TrimSuffix(strings.Repeat("?,", cols), ",") + "),"
	for rows := 1; rows <= maxInsertRows; rows *= 2 {
		st, err := db.Prepare(head + strings.TrimSuffix(strings.Repeat(row, rows), ","))
		if err != nil {
			return nil, fmt.Errorf("prepare insert of %d %s: %w", rows, what, err)
		}
		m.stmts[rows] = st
	}
	return m, nil
}

// insert inserts the rows of args (cols values each) in tx, by the largest
// prepared statements that fit.
func (m *multiInsert) insert(tx *sql.Tx, args []any) error {
	for len(args) > 0 {
		rows := 1
		for rows*2 <= len(args)/m.cols && rows*2 <= maxInsertRows {
			rows *= 2
		}
		if _, err := tx.Stmt(m.stmts[rows]).Exec(args[:rows*m.cols]...); err != nil {
			return fmt.Errorf("store %s: %w", m.what, err)
		}
		args = args[rows*m.cols:]
	}
	return nil
}

// close closes the prepared statements.
func (m *multiInsert) close() error {
	var first error
	if m == nil {
		return nil
	}
	for _, st := range m.stmts {
		if err := st.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
