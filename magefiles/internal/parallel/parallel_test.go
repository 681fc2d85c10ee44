package parallel

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// shJob is a job running script with sh -c; $1 is dir.
func shJob(name string, weight int64, dir, script string) Job {
	return Job{Name: name, Cmd: "sh", Args: []string{"-c", script, "sh", dir}, Weight: weight}
}

// rendezvous is a script that marks name started in $1, then waits up to
// ten seconds for other to have started too, failing if it does not.
func rendezvous(name, other string) string {
	return `echo ` + name + ` first line; touch "$1/` + name + `"; i=0
while [ ! -e "$1/` + other + `" ]; do i=$((i+1)); [ $i -gt 1000 ] && { echo ` + name + ` alone; exit 1; }; sleep 0.01; done
echo ` + name + ` last line`
}

func TestRunOverlapsHeaviestFirstWithinLimit(t *testing.T) {
	dir := t.TempDir()
	jobs := []Job{
		shJob("light", 1, dir, `echo light only line`),
		shJob("heavy-a", 9, dir, rendezvous("heavy-a", "heavy-b")),
		shJob("failing", 1, dir, `echo failing line; exit 3`),
		shJob("heavy-b", 8, dir, rendezvous("heavy-b", "heavy-a")),
	}
	var log strings.Builder
	results := Runner{Limit: 2, Out: &log}.Run(jobs)

	for i, r := range results {
		if r.Name != jobs[i].Name {
			t.Fatalf("result %d is %s, want %s: results in the order of the jobs", i, r.Name, jobs[i].Name)
		}
		if wantErr := r.Name == "failing"; (r.Err != nil) != wantErr {
			t.Errorf("%s: err %v, want an error: %v\n%s", r.Name, r.Err, wantErr, r.Output)
		}
	}
	text := log.String()
	starts := regexp.MustCompile(`(?m)^---- start (\S+) \((\d+) running`).FindAllStringSubmatch(text, -1)
	if len(starts) != len(jobs) || starts[0][1] != "heavy-a" || starts[1][1] != "heavy-b" {
		t.Errorf("start lines %q: want the two heavy jobs first, then the others", starts)
	}
	for _, s := range starts {
		if n, _ := strconv.Atoi(s[2]); n > 2 {
			t.Errorf("%s started with %d running, limit 2", s[1], n)
		}
	}
	// Each job's output is one block: its first and last lines are
	// adjacent in the log even though the heavy jobs ran together.
	for _, name := range []string{"heavy-a", "heavy-b"} {
		if !strings.Contains(text, name+" first line\n"+name+" last line\n") {
			t.Errorf("%s's output is not one block:\n%s", name, text)
		}
	}
	if !regexp.MustCompile(`(?m)^==== failing: FAIL: exit status 3 in `).MatchString(text) {
		t.Errorf("no outcome line for the failing job:\n%s", text)
	}
	if !strings.Contains(text, "light only line") {
		t.Errorf("the job after the failing one did not run or print:\n%s", text)
	}
}

func TestRunZeroLimitRunsOneAtATime(t *testing.T) {
	dir := t.TempDir()
	results := Runner{}.Run([]Job{
		shJob("first", 2, dir, `touch "$1/first"`),
		shJob("second", 1, dir, `test -e "$1/first"`),
	})
	for _, r := range results {
		if r.Err != nil {
			t.Errorf("%s: %v: the jobs did not run one after the other, heaviest first", r.Name, r.Err)
		}
	}
}
