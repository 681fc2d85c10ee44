package flakes

import (
	"strings"
	"testing"
	"time"
)

func TestCountRatesEachTest(t *testing.T) {
	stream := strings.Join([]string{
		`go: downloading something`,
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"pass","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:9: gap 2.03s > bound 2s\n"}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"--- FAIL: TestB (2.1s)\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestB"}`,
		`{"Action":"pass","Package":"p","Test":"TestB"}`,
		`{"Action":"pass","Package":"p","Test":"TestA"}`,
		`{"Action":"skip","Package":"p","Test":"TestC"}`,
		`{"Action":"fail","Package":"p"}`,
	}, "\n")
	got, err := Count(strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"p: TestB: 1 of 2 failed (50%): b_test.go:9: gap 2.03s > bound 2s",
		"p: TestA: 0 of 2 failed (0%)",
		"p: TestC: 0 of 1 failed (0%), 1 skipped",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d rates, want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("rate %d = %q, want %q", i, got[i], want[i])
		}
	}
}

// TestHogStops checks that stop returns: a hog left spinning would keep a
// CPU busy after the flakes target ends.
func TestHogStops(t *testing.T) {
	stop := Hog(2)
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("stop did not return within 10s")
	}
}
