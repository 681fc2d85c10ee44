package benchmarks

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Chart colours by kind of system.
var kindColor = map[Kind]string{Backend: "#2f6db5", Peer: "#e07b28", Floor: "#8c8c8c"}

const (
	svgWidth  = 960
	svgLabelW = 190 // system names, right-aligned before the bars
	svgBarX   = svgLabelW + 10
	svgBarW   = svgWidth - svgBarX - 220 // room for the value after the bar
	svgRowH   = 18
	svgBarH   = 13
)

// WriteSVG writes the report as a standalone SVG chart: p50 latency per
// system for each latency scenario, and contended hand-offs per second,
// as horizontal bars on log scales, coloured by kind (backend, peer, floor);
// and, when the many scenario ran, renewal round trips per master per tick.
func (rep *Report) WriteSVG(w io.Writer) error {
	var b strings.Builder
	y := 0
	var body strings.Builder

	y += 30
	fmt.Fprintf(&body, `<text x="10" y="%d" class="title">latchkey lockbench: %s, %d CPUs, %s</text>`+"\n", y,
		esc(firstNonEmpty(rep.Machine.CPU, rep.Machine.Arch)), rep.Machine.CPUs, rep.Machine.Started.Format("2006-01-02"))
	y += 22
	x := 10
	for _, k := range []Kind{Backend, Peer, Floor} {
		fmt.Fprintf(&body, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d" class="small">%s</text>`+"\n",
			x, y-10, kindColor[k], x+16, y, k)
		x += 90
	}

	type bar struct {
		label string
		kind  Kind
		value float64
		text  string
	}
	panel := func(title string, bars []bar, unit func(float64) string) {
		if len(bars) == 0 {
			return
		}
		y += 34
		fmt.Fprintf(&body, `<text x="10" y="%d" class="head">%s</text>`+"\n", y, esc(title))
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, br := range bars {
			if br.value > 0 {
				lo, hi = math.Min(lo, br.value), math.Max(hi, br.value)
			}
		}
		if math.IsInf(lo, 0) {
			return
		}
		l0, l1 := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if l1 <= l0 {
			l1 = l0 + 1
		}
		xOf := func(v float64) float64 {
			return svgBarX + (math.Log10(v)-l0)/(l1-l0)*svgBarW
		}
		y += 8
		top := y
		bottom := y + len(bars)*svgRowH + 4
		for e := l0; e <= l1; e++ {
			gx := xOf(math.Pow(10, e))
			fmt.Fprintf(&body, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" class="grid"/>`+"\n", gx, top, gx, bottom)
			fmt.Fprintf(&body, `<text x="%.1f" y="%d" class="tick" text-anchor="middle">%s</text>`+"\n", gx, bottom+13, esc(unit(math.Pow(10, e))))
		}
		for _, br := range bars {
			y += svgRowH
			fmt.Fprintf(&body, `<text x="%d" y="%d" text-anchor="end" class="label">%s</text>`+"\n", svgLabelW, y-4, esc(br.label))
			if br.value <= 0 {
				fmt.Fprintf(&body, `<text x="%d" y="%d" class="small">no data</text>`+"\n", svgBarX+4, y-4)
				continue
			}
			x1 := xOf(br.value)
			fmt.Fprintf(&body, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", svgBarX, y-svgBarH, math.Max(x1-svgBarX, 1), svgBarH, kindColor[br.kind])
			fmt.Fprintf(&body, `<text x="%.1f" y="%d" class="value">%s</text>`+"\n", x1+4, y-3, esc(br.text))
		}
		y = bottom + 16
	}

	kindOf := func(name string) Kind {
		if e, ok := Lookup(name); ok {
			return e.Kind
		}
		return Backend
	}
	byScenario := func(sc string) []Result {
		var out []Result
		for _, r := range rep.sorted() {
			if r.Scenario == sc {
				out = append(out, r)
			}
		}
		return out
	}
	// Tick labels are powers of ten: 1µs, 10µs, 100µs, 1ms...
	durUnit := func(v float64) string {
		d := time.Duration(math.Round(v))
		for _, u := range []struct {
			s string
			d time.Duration
		}{{"s", time.Second}, {"ms", time.Millisecond}, {"µs", time.Microsecond}} {
			if d >= u.d {
				return strconv.FormatInt(int64(d/u.d), 10) + u.s
			}
		}
		return strconv.FormatInt(int64(d), 10) + "ns"
	}
	countUnit := func(v float64) string {
		switch {
		case v >= 1e6:
			return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
		case v >= 1e3:
			return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
		}
		return strconv.FormatFloat(v, 'g', 3, 64)
	}

	for _, sc := range []struct{ name, title string }{
		{Uncontended, "uncontended: p50 of Lock + Release (log scale, shorter is better)"},
		{Handoff, "handoff: p50 from Release to the waiter holding (log scale, shorter is better)"},
		{Semaphore, "semaphore: p50 of Acquire with the other slots held (log scale, shorter is better)"},
	} {
		var bars []bar
		for _, r := range byScenario(sc.name) {
			bars = append(bars, bar{r.System, kindOf(r.System), float64(r.P50), FormatDuration(r.P50Duration())})
		}
		panel(sc.title, bars, durUnit)
	}
	var bars []bar
	for _, r := range byScenario(Contended) {
		text := FormatRate(r.Ops) + "/s"
		if sw, ok := rep.Metric(r.System, Contended, "switches_per_s"); ok {
			text += " (" + FormatRate(sw) + "/s to another client)"
		}
		bars = append(bars, bar{r.System, kindOf(r.System), r.Ops, text})
	}
	panel("contended: hand-offs per second, 8 clients on one name (log scale, longer is better)", bars, countUnit)
	bars = nil
	for _, r := range byScenario(Many) {
		v, _ := rep.Metric(r.System, Many, "round_trips_per_master_per_tick")
		bars = append(bars, bar{r.System, kindOf(r.System), v, fmtRatio(v)})
	}
	panel("many: renewal round trips per master per tick, one process holding many leases (log, shorter is better)", bars, countUnit)

	height := y + 10
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">`+"\n",
		svgWidth, height, svgWidth, height)
	b.WriteString(`<style>
.title{font-size:17px;font-weight:bold;fill:#222}
.head{font-size:14px;font-weight:bold;fill:#222}
.label{font-size:12px;fill:#222}
.value{font-size:11px;fill:#333}
.tick{font-size:10px;fill:#666}
.small{font-size:11px;fill:#444}
.grid{stroke:#ddd;stroke-width:1}
</style>
<rect width="100%" height="100%" fill="#fff"/>
`)
	b.WriteString(body.String())
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func esc(s string) string { return html.EscapeString(s) }

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}
