package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
	"github.com/latchkey-go/latchkey/contracttest/testenv/natsenv"
	"github.com/latchkey-go/latchkey/natsputex"
)

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// silentHolder makes bucket (in memory) on url and writes token in key,
// as a holder that then went silent would have.
func silentHolder(t *testing.T, url, bucket, key, token string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := natsputex.New(ctx, js, bucket, natsputex.WithStorage(jetstream.MemoryStorage))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, key, []byte(token)); err != nil {
		t.Fatal(err)
	}
}

// logLines parses out, natslock's JSON log, one object a line.
func logLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Errorf("a log line is not JSON: %q: %v", sc.Text(), err)
			continue
		}
		lines = append(lines, m)
	}
	return lines
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v\n%s", url, resp.Status, err, b)
	}
	return string(b)
}

// metricValue returns the value of the series line (name and labels, as
// the exposition writes them) in exposition, and whether it is there.
func metricValue(exposition, series string) (float64, bool) {
	for line := range strings.Lines(exposition) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// TestNatslockMetrics: natslock with --metrics-addr 127.0.0.1:0 and
// --log-format json takes over a key whose holder is silent, confirms,
// starts its service; /state and /metrics then say active, one
// takeover, one start that succeeded, and a last renewal; every log line
// is a JSON object with the key and token; SIGTERM ends it with status 0.
func TestNatslockMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs natslock")
	}
	bin := cmdtest.Build(t, ".")
	url := natsenv.StartServer(t).URL()
	bucket, key := cmdtest.UniqueName("natslockmetrics"), "svc"
	silentHolder(t, url, bucket, key, "ghost")

	p := cmdtest.Start(t, bin, "-r", "100ms", "-f", "3", "-c", "1", "--log-format", "json",
		"--metrics-addr", "127.0.0.1:0", "-healthcheck", "true", "-start", "true", "-stop", "true",
		url, bucket, key, "node-a")
	logs := &p.Out
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("natslock's log:\n%s", logs.String())
		}
	})

	var base string
	waitFor(t, 10*time.Second, "natslock says where it serves its metrics", func() bool {
		for _, l := range logLines(t, logs.String()) {
			if l["msg"] == "serving metrics and state" {
				base, _ = l["addr"].(string)
			}
		}
		return base != ""
	})
	var st snapshot
	waitFor(t, 10*time.Second, "/state says active", func() bool {
		st = snapshot{}
		if err := json.Unmarshal([]byte(get(t, "http://"+base+"/state")), &st); err != nil {
			t.Fatal(err)
		}
		return st.Phase == "active" && st.LastRenewal != nil
	})
	if st.Key != key || st.Token != "node-a" || st.Holder != "node-a" || st.FencingToken == 0 {
		t.Errorf("/state: key %q token %q holder %q fencing token %d; want %q, node-a, node-a and a token", st.Key, st.Token, st.Holder, st.FencingToken, key)
	}
	if st.Takeovers != 1 || st.Starts[outcomeOK] != 1 || st.Starts[outcomeFailed] != 0 || st.HealthCheckFailures != 0 {
		t.Errorf("/state: %d takeovers, starts %v, %d failed health checks; want 1, 1 ok, 0", st.Takeovers, st.Starts, st.HealthCheckFailures)
	}
	if age := time.Since(*st.LastRenewal); age < -time.Second || age > 10*time.Second {
		t.Errorf("/state: last renewal %v ago, want within the last seconds", age)
	}

	exposition := get(t, "http://"+base+"/metrics")
	for line := range strings.Lines(exposition) {
		if strings.HasPrefix(line, "latchkey_natslock_") {
			t.Logf("/metrics: %s", strings.TrimSpace(line))
		}
	}
	for series, want := range map[string]float64{
		`latchkey_natslock_phase{phase="active"}`:                  1,
		`latchkey_natslock_phase{phase="standby"}`:                 0,
		`latchkey_natslock_phase{phase="confirming"}`:              0,
		`latchkey_natslock_takeovers_total`:                        1,
		`latchkey_natslock_service_starts_total{outcome="ok"}`:     1,
		`latchkey_natslock_service_starts_total{outcome="failed"}`: 0,
		`latchkey_natslock_service_stops_total{outcome="failed"}`:  0,
		`latchkey_natslock_health_check_failures_total`:            0,
	} {
		if got, ok := metricValue(exposition, series); !ok || got != want {
			t.Errorf("/metrics: %s = %v (found: %v), want %v", series, got, ok, want)
		}
	}
	if ts, ok := metricValue(exposition, "latchkey_natslock_last_renewal_timestamp_seconds"); !ok || time.Since(time.Unix(int64(ts), 0)) > time.Minute {
		t.Errorf("/metrics: latchkey_natslock_last_renewal_timestamp_seconds = %v (found: %v), want a time in the last minute", ts, ok)
	}

	_ = p.Process.Signal(syscall.SIGTERM)
	if code := p.ExitCode(t, 5*time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM: %d, want 0", code)
	}
	phases := map[string]bool{}
	for _, l := range logLines(t, logs.String()) {
		if l["key"] != key || l["token"] != "node-a" || l["level"] == nil || l["time"] == nil {
			t.Errorf("a log line without its time, level, key or token: %v", l)
		}
		if p, ok := l["phase"].(string); ok {
			phases[p] = true
		}
	}
	for _, p := range []string{"standby", "confirming", "active"} {
		if !phases[p] {
			t.Errorf("no log line with phase %q", p)
		}
	}
}
