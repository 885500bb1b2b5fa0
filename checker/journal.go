package checker

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
)

// Journal records a producer's attempted transactions in a file, one JSON line
// per step, so that the checker can tell what was meant to commit. Call Begin
// before the transaction starts and End once its outcome is known: a transaction
// begun but never ended (the producer died) reads back as Unknown.
//
// Every line is one write(2) to a file opened O_APPEND, with no buffering in the
// process, so a SIGKILL loses nothing the producer was told happened. It does not
// fsync: the journal survives a process crash, not a machine crash.
//
// The format, one object per line:
//
//	{"tx":"p1-17","op":"begin","events":[{"event_id":"0190…","key":"order-42"}]}
//	{"tx":"p1-17","op":"committed"}        (or "rolled_back", "unknown")
type Journal struct {
	mu sync.Mutex
	f  *os.File
}

type journalLine struct {
	Tx     string   `json:"tx"`
	Op     string   `json:"op"`
	Events []Intent `json:"events,omitempty"`
}

// OpenJournal opens (creating it if needed) the journal at path for appending.
func OpenJournal(path string) (*Journal, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("checker: open journal: %w", err)
	}
	return &Journal{f: f}, nil
}

func (j *Journal) write(l journalLine) error {
	b, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("checker: journal: %w", err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("checker: journal %s: %w", l.Op, err)
	}
	return nil
}

// Begin records that transaction tx is about to write intents. Call it before the
// transaction's first statement.
func (j *Journal) Begin(tx string, intents []Intent) error {
	return j.write(journalLine{Tx: tx, Op: "begin", Events: intents})
}

// End records what the producer knows of tx's outcome.
func (j *Journal) End(tx string, o Outcome) error {
	switch o {
	case Committed, RolledBack, Unknown:
	default:
		return fmt.Errorf("checker: journal: unknown outcome %q", o)
	}
	return j.write(journalLine{Tx: tx, Op: string(o)})
}

// Close closes the file.
func (j *Journal) Close() error { return j.f.Close() }

// ReadJournal reads journals (one or more concatenated) back into attempts, in the
// order their transactions began. A last line cut short by a crash is ignored: it
// was written before its transaction began.
func ReadJournal(r io.Reader) ([]Attempt, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	out := []Attempt{}
	index := map[string]int{}
	var pendingErr error
	n := 0
	for sc.Scan() {
		n++
		if pendingErr != nil {
			return nil, pendingErr // a bad line that was not the last
		}
		var l journalLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			pendingErr = fmt.Errorf("checker: journal line %d: %w", n, err)
			continue
		}
		switch l.Op {
		case "begin":
			if _, dup := index[l.Tx]; dup {
				return nil, fmt.Errorf("checker: journal line %d: transaction %q begun twice", n, l.Tx)
			}
			index[l.Tx] = len(out)
			out = append(out, Attempt{Tx: l.Tx, Outcome: Unknown, Intents: l.Events})
		case string(Committed), string(RolledBack), string(Unknown):
			i, ok := index[l.Tx]
			if !ok {
				return nil, fmt.Errorf("checker: journal line %d: outcome of transaction %q that never began", n, l.Tx)
			}
			out[i].Outcome = Outcome(l.Op)
		default:
			return nil, fmt.Errorf("checker: journal line %d: unknown op %q", n, l.Op)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("checker: read journal: %w", err)
	}
	return out, nil
}

// ReadJournalFiles reads the journals at paths, as ReadJournal; a missing file
// is an error.
func ReadJournalFiles(paths ...string) ([]Attempt, error) {
	var all []Attempt
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("checker: %w", err)
		}
		a, err := ReadJournal(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		all = append(all, a...)
	}
	if all == nil {
		all = []Attempt{}
	}
	return all, nil
}
