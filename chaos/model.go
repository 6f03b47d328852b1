package main

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// The fenced-register model, against which porcupine checks the history.
//
// The system is a register of terms: the database grants terms with
// strictly increasing fencing tokens, and a write commits under the token
// its transaction verified. Its sequential specification, with state
// (cur, seq) — the highest token granted or written under so far, and the
// commit-order number of the last committed write:
//
//	grant(T)       legal iff T > cur;                  then cur = T
//	write(T, s) ok legal iff T >= cur and s > seq;     then cur = T, seq = s
//
// A write under T is legal only while no higher token was granted: T is
// at least the highest grant so far and, since grants only raise cur, its
// term has not been superseded. A write whose token was never seen granted
// (its grant was not observed: the node died before recording it) proves
// the grant happened, so it raises cur. s is the number the write took from
// the locked counter row, so s order is commit order. Refused writes change
// nothing and are left out of the history; a write of unknown outcome is
// kept only if its row is in the final database (it committed, at a moment
// we do not know: its return is the end of the experiment), and dropped if
// it is not (it never took effect).
//
// Why a correct system satisfies it: let each operation take effect at the
// moment its statement commits. Grants commit one at a time on the lease
// row with token = previous + 1, so they raise cur. Fence (or the tip
// guard) holds the lease row shared until the write commits, and checks in
// the same transaction that its token is the current, unexpired one; no
// grant can commit in between, so at the write's commit the latest grant is
// its own token, T = cur. The counter row is locked by every write until it
// commits, so s increases along commits. A grant whose answer was lost is
// simply not in the history; it can only make cur lower than the truth,
// which makes the check weaker, never wrong.
type regState struct {
	cur uint64
	seq int64
}

type regInput struct {
	grant bool
	token uint64
	seq   int64
	op    string // the write's id, or the granting node
}

var registerModel = porcupine.Model{
	Init: func() any { return regState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, in := state.(regState), input.(regInput)
		if in.grant {
			if in.token > s.cur {
				return true, regState{cur: in.token, seq: s.seq}
			}
			return false, s
		}
		if in.token >= s.cur && in.seq > s.seq {
			return true, regState{cur: in.token, seq: in.seq}
		}
		return false, s
	},
	DescribeOperation: func(input, _ any) string {
		in := input.(regInput)
		if in.grant {
			return fmt.Sprintf("grant(%d) to %s", in.token, in.op)
		}
		return fmt.Sprintf("write(%d) #%d %s", in.token, in.seq, in.op)
	},
	DescribeState: func(state any) string {
		s := state.(regState)
		return fmt.Sprintf("cur=%d seq=%d", s.cur, s.seq)
	},
}
