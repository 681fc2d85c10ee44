package parallel

import (
	"os"
	"regexp"
	"slices"
	"testing"
)

// testdata/gotest-failures.txt is the output of `go test -timeout=1s ./...`
// on two packages: one with a failed sub-subtest and a test still running
// at the timeout, one that does not compile.
func TestFailuresNamesLeavesTimeoutsAndPackages(t *testing.T) {
	out, err := os.ReadFile("testdata/gotest-failures.txt")
	if err != nil {
		t.Fatal(err)
	}
	got := Failures(string(out))
	wantTests := []string{"TestBad/sub/deep", "TestSlow (timed out)"}
	wantPackages := []string{"gt/a", "gt/b [build failed]"}
	if !slices.Equal(got.Tests, wantTests) || !slices.Equal(got.Packages, wantPackages) {
		t.Errorf("Failures = %+v, want tests %q, packages %q", got, wantTests, wantPackages)
	}
	if s, want := got.String(), "TestBad/sub/deep, TestSlow (timed out)"; s != want {
		t.Errorf("String() = %q, want %q", s, want)
	}
}

func TestFailuresWithoutTestNamesPackages(t *testing.T) {
	out := "ok  \texample.com/a\t0.1s\npanic: boom\nFAIL\texample.com/b\t0.2s\nFAIL\n"
	got := Failures(out)
	if len(got.Tests) != 0 || !slices.Equal(got.Packages, []string{"example.com/b"}) {
		t.Errorf("Failures = %+v, want only package example.com/b", got)
	}
	if s, want := got.String(), "no failed test named; failed: example.com/b"; s != want {
		t.Errorf("String() = %q, want %q", s, want)
	}
}

func TestTestNamesSkipsTestMainAndHelpers(t *testing.T) {
	src := "package p\n\nfunc TestMain(m *testing.M) {}\nfunc TestA(t *testing.T) {}\nfunc helper() {}\nfunc (s suite) TestMethod(t *testing.T) {}\n" +
		"func FuzzB(f *testing.F) {}\nfunc ExampleC() {}\n\tfunc TestIndented() {}\nfunc BenchmarkD(b *testing.B) {}\n"
	if got, want := TestNames(src), []string{"TestA", "FuzzB", "ExampleC"}; !slices.Equal(got, want) {
		t.Errorf("TestNames = %q, want %q", got, want)
	}
}

func TestShardsRunEachNameOnce(t *testing.T) {
	names := []string{"TestA", "TestAB", "TestB", "TestC", "TestD"}
	patterns := Shards(names, 2)
	if want := []string{"^(TestA|TestB|TestD)$", "^(TestAB|TestC)$"}; !slices.Equal(patterns, want) {
		t.Fatalf("Shards = %q, want %q", patterns, want)
	}
	for _, name := range append(names, "TestABC", "TestE") {
		matched := 0
		for _, p := range patterns {
			if regexp.MustCompile(p).MatchString(name) {
				matched++
			}
		}
		want := 0
		if slices.Contains(names, name) {
			want = 1
		}
		if matched != want {
			t.Errorf("%s matches %d patterns, want %d", name, matched, want)
		}
	}
	if got := Shards(names, 9); len(got) != len(names) {
		t.Errorf("Shards(5 names, 9) = %d patterns, want 5", len(got))
	}
	if got := Shards(names, 0); len(got) != 1 {
		t.Errorf("Shards(names, 0) = %q, want one pattern", got)
	}
}
