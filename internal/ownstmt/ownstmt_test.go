package ownstmt

import (
	"context"
	"testing"
)

func TestMark(t *testing.T) {
	ctx := context.Background()
	if Is(ctx) {
		t.Fatal("an unmarked context is marked")
	}
	if !Is(With(ctx)) {
		t.Fatal("a marked context is not")
	}
	if !Is(context.WithoutCancel(With(ctx))) {
		t.Fatal("a context derived from a marked one lost the mark")
	}
}
