package benchmarks

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
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
// when the many scenario ran, renewal round trips per master per tick; and
// when the waiters scenario ran, hand-offs to another client per second
// against the waiter count, one line per system, on log scales.
func (rep *Report) WriteSVG(w io.Writer) error {
	c := &svgChart{}
	c.header(rep)
	for _, sc := range []struct{ name, title string }{
		{Uncontended, "uncontended: p50 of Lock + Release (log scale, shorter is better)"},
		{Handoff, "handoff: p50 from Release to the waiter holding (log scale, shorter is better)"},
		{Semaphore, "semaphore: p50 of Acquire with the other slots held (log scale, shorter is better)"},
	} {
		var bars []svgBar
		for _, r := range rep.byScenario(sc.name) {
			bars = append(bars, svgBar{r.System, kindOf(r.System), float64(r.P50), FormatDuration(r.P50Duration())})
		}
		c.panel(sc.title, bars, durationTick)
	}
	var bars []svgBar
	for _, r := range rep.byScenario(Contended) {
		text := FormatRate(r.Ops) + "/s"
		if sw, ok := rep.Metric(r.System, Contended, "switches_per_s"); ok {
			text += " (" + FormatRate(sw) + "/s to another client)"
		}
		bars = append(bars, svgBar{r.System, kindOf(r.System), r.Ops, text})
	}
	c.panel("contended: hand-offs per second, 8 clients on one name (log scale, longer is better)", bars, countTick)
	bars = nil
	for _, r := range rep.byScenario(Many) {
		v, _ := rep.Metric(r.System, Many, "round_trips_per_master_per_tick")
		bars = append(bars, svgBar{r.System, kindOf(r.System), v, fmtRatio(v)})
	}
	c.panel("many: renewal round trips per master per tick, one process holding many leases (log, shorter is better)", bars, countTick)
	c.waitersPanel(rep)
	_, err := io.WriteString(w, c.document())
	return err
}

// svgChart is a chart being drawn, top to bottom.
type svgChart struct {
	body strings.Builder
	y    int // the bottom of what is drawn
}

// svgBar is one bar of a panel.
type svgBar struct {
	label string
	kind  Kind
	value float64
	text  string
}

// header draws the title and the legend.
func (c *svgChart) header(rep *Report) {
	c.y += 30
	fmt.Fprintf(&c.body, `<text x="10" y="%d" class="title">latchkey lockbench: %s, %d CPUs, %s</text>`+"\n", c.y,
		esc(firstNonEmpty(rep.Machine.CPU, rep.Machine.Arch)), rep.Machine.CPUs, rep.Machine.Started.Format("2006-01-02"))
	c.y += 22
	x := 10
	for _, k := range []Kind{Backend, Peer, Floor} {
		fmt.Fprintf(&c.body, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d" class="small">%s</text>`+"\n",
			x, c.y-10, kindColor[k], x+16, c.y, k)
		x += 90
	}
}

// panel draws bars on a log scale under title, with ticks labelled by
// unit; it draws nothing without bars.
func (c *svgChart) panel(title string, bars []svgBar, unit func(float64) string) {
	if len(bars) == 0 {
		return
	}
	c.y += 34
	fmt.Fprintf(&c.body, `<text x="10" y="%d" class="head">%s</text>`+"\n", c.y, esc(title))
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
	c.y += 8
	top := c.y
	bottom := c.y + len(bars)*svgRowH + 4
	for e := l0; e <= l1; e++ {
		gx := xOf(math.Pow(10, e))
		fmt.Fprintf(&c.body, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" class="grid"/>`+"\n", gx, top, gx, bottom)
		fmt.Fprintf(&c.body, `<text x="%.1f" y="%d" class="tick" text-anchor="middle">%s</text>`+"\n", gx, bottom+13, esc(unit(math.Pow(10, e))))
	}
	for _, br := range bars {
		c.y += svgRowH
		fmt.Fprintf(&c.body, `<text x="%d" y="%d" text-anchor="end" class="label">%s</text>`+"\n", svgLabelW, c.y-4, esc(br.label))
		if br.value <= 0 {
			fmt.Fprintf(&c.body, `<text x="%d" y="%d" class="small">no data</text>`+"\n", svgBarX+4, c.y-4)
			continue
		}
		x1 := xOf(br.value)
		fmt.Fprintf(&c.body, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", svgBarX, c.y-svgBarH, math.Max(x1-svgBarX, 1), svgBarH, kindColor[br.kind])
		fmt.Fprintf(&c.body, `<text x="%.1f" y="%d" class="value">%s</text>`+"\n", x1+4, c.y-3, esc(br.text))
	}
	c.y = bottom + 16
}

// seriesColors tell the lines of the waiters panel apart.
var seriesColors = []string{"#2f6db5", "#e07b28", "#3a9a48", "#c8372d", "#8e5bb5", "#8c564b", "#d36bb4", "#7f7f7f", "#b5b32f", "#2fb5c4"}

// waitersPanel draws hand-offs to another client per second against the
// waiter count, one line per system, both axes log-scaled; it draws
// nothing without waiters results.
func (c *svgChart) waitersPanel(rep *Report) {
	type point struct{ x, y float64 }
	var (
		names  []string
		series = map[string][]point{}
	)
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, r := range rep.sorted() {
		base, n := splitScenario(r.Scenario)
		if base != Waiters || n == 0 {
			continue
		}
		sw, ok := rep.Metric(r.System, r.Scenario, MetricSwitches)
		if !ok || sw <= 0 {
			continue
		}
		if series[r.System] == nil {
			names = append(names, r.System)
		}
		series[r.System] = append(series[r.System], point{float64(n), sw})
		xlo, xhi = math.Min(xlo, float64(n)), math.Max(xhi, float64(n))
		ylo, yhi = math.Min(ylo, sw), math.Max(yhi, sw)
	}
	if len(names) == 0 {
		return
	}
	// names follow the registry's order: sorted() goes by count, then system.
	order := map[string]int{}
	for i, e := range Systems() {
		order[e.Name] = i
	}
	slices.SortStableFunc(names, func(a, b string) int { return order[a] - order[b] })
	c.y += 34
	fmt.Fprintf(&c.body, `<text x="10" y="%d" class="head">%s</text>`+"\n", c.y,
		esc("waiters: hand-offs to another client per second against waiters (log–log, higher is better)"))
	x0, x1 := math.Floor(math.Log10(xlo)), math.Ceil(math.Log10(xhi))
	y0, y1 := math.Floor(math.Log10(ylo)), math.Ceil(math.Log10(yhi))
	if x1 <= x0 {
		x1 = x0 + 1
	}
	if y1 <= y0 {
		y1 = y0 + 1
	}
	const plotX, plotW, plotH = 70, 620, 300
	top := c.y + 16
	bottom := top + plotH
	xOf := func(v float64) float64 { return plotX + (math.Log10(v)-x0)/(x1-x0)*plotW }
	yOf := func(v float64) float64 { return float64(bottom) - (math.Log10(v)-y0)/(y1-y0)*plotH }
	for e := y0; e <= y1; e++ {
		gy := yOf(math.Pow(10, e))
		fmt.Fprintf(&c.body, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" class="grid"/>`+"\n", plotX, gy, plotX+plotW, gy)
		fmt.Fprintf(&c.body, `<text x="%d" y="%.1f" class="tick" text-anchor="end">%s/s</text>`+"\n", plotX-4, gy+3, esc(countTick(math.Pow(10, e))))
	}
	var ticks []float64
	for _, p := range series[names[0]] {
		ticks = append(ticks, p.x)
	}
	for _, n := range names[1:] {
		for _, p := range series[n] {
			if !slices.Contains(ticks, p.x) {
				ticks = append(ticks, p.x)
			}
		}
	}
	for _, t := range ticks {
		gx := xOf(t)
		fmt.Fprintf(&c.body, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" class="grid"/>`+"\n", gx, top, gx, bottom)
		fmt.Fprintf(&c.body, `<text x="%.1f" y="%d" class="tick" text-anchor="middle">%s</text>`+"\n", gx, bottom+13, esc(countTick(t)))
	}
	fmt.Fprintf(&c.body, `<text x="%d" y="%d" class="small" text-anchor="middle">waiters (clients on one name, log scale)</text>`+"\n", plotX+plotW/2, bottom+28)
	for i, n := range names {
		color := seriesColors[i%len(seriesColors)]
		dash := ""
		if k := kindOf(n); k != Backend {
			dash = ` stroke-dasharray="6,3"`
		}
		var pts []string
		for _, p := range series[n] {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(p.x), yOf(p.y)))
			fmt.Fprintf(&c.body, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", xOf(p.x), yOf(p.y), color)
		}
		fmt.Fprintf(&c.body, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), color, dash)
		ly := top + 10 + i*18
		fmt.Fprintf(&c.body, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", plotX+plotW+20, ly-4, plotX+plotW+44, ly-4, color, dash)
		fmt.Fprintf(&c.body, `<text x="%d" y="%d" class="label">%s (%s)</text>`+"\n", plotX+plotW+50, ly, esc(n), kindOf(n))
	}
	c.y = max(bottom+36, top+len(names)*18+10)
}

// document returns the whole SVG document.
func (c *svgChart) document() string {
	var b strings.Builder
	height := c.y + 10
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
	b.WriteString(c.body.String())
	b.WriteString("</svg>\n")
	return b.String()
}

// kindOf returns the kind of the system called name (a backend if it is
// not in the registry).
func kindOf(name string) Kind {
	if e, ok := Lookup(name); ok {
		return e.Kind
	}
	return Backend
}

// byScenario returns the results of scenario sc, in report order.
func (rep *Report) byScenario(sc string) []Result {
	var out []Result
	for _, r := range rep.sorted() {
		if r.Scenario == sc {
			out = append(out, r)
		}
	}
	return out
}

// durationTick labels a tick that is a power of ten of nanoseconds: 1µs,
// 10µs, 100µs, 1ms...
func durationTick(v float64) string {
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

// countTick labels a tick that is a count: 100, 1k, 10k, 1M...
func countTick(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
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
