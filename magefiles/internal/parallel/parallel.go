// Package parallel runs commands side by side, a bounded number at a time,
// the heaviest first, and prints each one's output as one block when it
// ends, so that a log of commands run together reads as if they had run
// one after another. It backs `go run mage.go test`, which runs every
// workspace module's tests this way: the tests mostly wait on timers and
// brokers, so modules overlap well even on two cores.
package parallel

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"
)

// A Job is one command to run.
type Job struct {
	Name   string   // how the log and the summary name it, such as a module's directory
	Dir    string   // where the command runs; "" is the current directory
	Cmd    string   // the program
	Args   []string // its arguments, passed as they are
	Weight int64    // its expected cost: heavier jobs start first
}

// A Result is how a job ended.
type Result struct {
	Job
	Output  string        // its stdout and stderr, interleaved as written
	Err     error         // nil when it exited 0
	Elapsed time.Duration // from its start to its end
}

// A Runner runs jobs. The zero Runner runs one job at a time and writes
// nowhere.
type Runner struct {
	// Limit is how many jobs run at once; less than 1 means 1.
	Limit int
	// Out receives each job's block and the progress lines; nil discards them.
	Out io.Writer
	// Every, if positive, is how often to print which jobs are still
	// running, so that a long quiet stretch of the log shows progress.
	Every time.Duration
	// Line renders a job's command for the log; nil joins Cmd and Args
	// with blanks.
	Line func(Job) string
}

// Run runs the jobs, at most r.Limit at a time, heaviest first (jobs of
// equal weight in the order given), waits for all of them whatever their
// outcomes, and returns their results in the order of jobs. Each job's
// output goes to r.Out as one block when the job ends, between a line
// naming the job and its command and a line with its outcome and elapsed
// time. Run is not safe to call on one Runner from several goroutines.
func (r Runner) Run(jobs []Job) []Result {
	out := r.Out
	if out == nil {
		out = io.Discard
	}
	p := &progress{out: out, running: map[string]time.Time{}, total: len(jobs)}
	order := make([]int, len(jobs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(jobs[b].Weight, jobs[a].Weight) })

	stopTicker := p.tick(r.Every)
	defer stopTicker()

	results := make([]Result, len(jobs))
	slots := make(chan struct{}, max(r.Limit, 1))
	var wg sync.WaitGroup
	for _, i := range order {
		slots <- struct{}{}
		p.started(jobs[i].Name)
		wg.Go(func() {
			defer func() { <-slots }()
			res := runJob(jobs[i])
			results[i] = res
			p.ended(res, r.line(jobs[i]))
		})
	}
	wg.Wait()
	return results
}

func (r Runner) line(j Job) string {
	if r.Line != nil {
		return r.Line(j)
	}
	return strings.Join(append([]string{j.Cmd}, j.Args...), " ")
}

// runJob runs j with its output kept in memory.
func runJob(j Job) Result {
	var buf bytes.Buffer
	c := exec.Command(j.Cmd, j.Args...)
	c.Dir, c.Stdout, c.Stderr = j.Dir, &buf, &buf
	start := time.Now()
	err := c.Run()
	return Result{Job: j, Output: buf.String(), Err: err, Elapsed: time.Since(start)}
}

// progress writes the log: one block per ended job, a line per started
// job, and the jobs still running. Its methods are safe to call from
// several goroutines.
type progress struct {
	mu      sync.Mutex
	out     io.Writer
	running map[string]time.Time // name: start
	total   int
	done    int
}

func (p *progress) started(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running[name] = time.Now()
	fmt.Fprintf(p.out, "---- start %s (%d running, %d of %d done)\n", name, len(p.running), p.done, p.total)
}

func (p *progress) ended(res Result, line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.running, res.Name)
	p.done++
	outcome := "ok"
	if res.Err != nil {
		outcome = "FAIL: " + res.Err.Error()
	}
	fmt.Fprintf(p.out, "==== %s: + %s\n", res.Name, line)
	io.WriteString(p.out, res.Output)
	if res.Output != "" && !strings.HasSuffix(res.Output, "\n") {
		io.WriteString(p.out, "\n")
	}
	fmt.Fprintf(p.out, "==== %s: %s in %s (%d of %d done)%s\n", res.Name, outcome, res.Elapsed.Round(time.Second), p.done, p.total, p.stillRunning())
}

// stillRunning lists the running jobs with how long each has run, longest
// first; "" when none runs. It is called with p.mu held.
func (p *progress) stillRunning() string {
	if len(p.running) == 0 {
		return ""
	}
	names := make([]string, 0, len(p.running))
	for n := range p.running {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Or(p.running[a].Compare(p.running[b]), strings.Compare(a, b))
	})
	for i, n := range names {
		names[i] = fmt.Sprintf("%s %s", n, time.Since(p.running[n]).Round(time.Second))
	}
	return "; still running: " + strings.Join(names, ", ")
}

// tick prints the running jobs every d until the returned stop is called;
// with d <= 0 it prints nothing.
func (p *progress) tick(d time.Duration) (stop func()) {
	if d <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				p.mu.Lock()
				if s := p.stillRunning(); s != "" {
					fmt.Fprintf(p.out, "---- %d of %d done%s\n", p.done, p.total, s)
				}
				p.mu.Unlock()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
