package main

import (
	"fmt"
	"image/color"
	"os"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The chart beside the table: deductions per second of each variant, and
// requests per second of each HTTP phase, with the lines the SPEC's targets
// draw on them.

var (
	ours   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff} // this project's paths
	others = color.RGBA{R: 0xa0, G: 0xa0, B: 0xa0, A: 0xff} // what they are compared with
	mark   = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff} // a target or a ceiling
)

// bar is one bar of a panel.
type bar struct {
	name  string
	value float64
	ours  bool
}

// rule is a vertical line across a panel: a target or a ceiling.
type rule struct {
	name string
	at   float64
}

// writeChart draws the panels that have bars, one under the other, as a PNG
// at path; false when there is nothing to draw.
func writeChart(path string, rs []result, web []httpResult) bool {
	var panels []*plot.Plot
	if len(rs) > 0 {
		var bars []bar
		for _, r := range rs {
			bars = append(bars, bar{r.name, r.rate(), r.name == "lua" || r.name == "lua-pipelined"})
		}
		var rules []rule
		for _, c := range serverCosts {
			if c.phase == costWindow {
				rules = append(rules, rule{fmt.Sprintf("one hot SKU, one Redis core: 1,000,000 / %.2f µs per call", c.perCall()), c.ceiling()})
			}
		}
		panels = append(panels, panel("Deductions per second, one hot SKU", "deductions/s", bars, rules))
	}
	if len(web) >= 3 {
		var bars []bar
		for _, r := range web {
			bars = append(bars, bar{r.name, r.rate, !strings.HasPrefix(r.name, "bare")})
		}
		bare := web[0].rate
		panels = append(panels, panel(fmt.Sprintf("HTTP, %d clients", *workers), "requests/s", bars,
			[]rule{{"selling target (80% of bare #1)", 0.8 * bare}, {"sold-out target (2× bare #1)", 2 * bare}}))
	}
	if len(panels) == 0 {
		return false
	}
	const w, h = 8 * vg.Inch, 3.2 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h*vg.Length(len(panels))), vgimg.UseDPI(110))
	dc := draw.New(img)
	grid := make([][]*plot.Plot, len(panels))
	for i, p := range panels {
		grid[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadY: vg.Points(12), PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(6)}
	for i, c := range plot.Align(grid, tiles, dc) {
		panels[i].Draw(c[0])
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable: chart:", err)
		return false
	}
	defer f.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable: chart:", err)
		return false
	}
	return true
}

// panel is one horizontal bar chart, the first bar on top, each bar labelled
// with its value, with the rules drawn as dashed lines.
func panel(title, unit string, bars []bar, rules []rule) *plot.Plot {
	bars = slices.Clone(bars)
	slices.Reverse(bars) // the y axis counts up from the bottom
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = unit
	p.X.Min = 0
	names := make([]string, len(bars))
	top := 0.0
	for i, b := range bars {
		names[i] = b.name
		top = max(top, b.value)
		// One chart per colour: a bar chart has one fill.
		vs := make(plotter.Values, len(bars))
		vs[i] = b.value
		bc, err := plotter.NewBarChart(vs, vg.Points(14))
		must(err)
		bc.Horizontal = true
		bc.LineStyle.Width = 0
		bc.Color = others
		if b.ours {
			bc.Color = ours
		}
		p.Add(bc)
	}
	labels := plotter.XYLabels{}
	for i, b := range bars {
		labels.XYs = append(labels.XYs, plotter.XY{X: b.value, Y: float64(i)})
		labels.Labels = append(labels.Labels, fmt.Sprintf(" %s", thousands(b.value)))
	}
	l, err := plotter.NewLabels(labels)
	must(err)
	for i := range l.TextStyle {
		l.TextStyle[i].YAlign = draw.YCenter
		l.TextStyle[i].Font.Size = vg.Points(8)
	}
	p.Add(l)
	for i, r := range rules {
		top = max(top, r.at)
		line, err := plotter.NewLine(plotter.XYs{{X: r.at, Y: -0.5}, {X: r.at, Y: float64(len(bars)) - 0.5}})
		must(err)
		line.Color = mark
		line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(line)
		name, err := plotter.NewLabels(plotter.XYLabels{
			XYs: []plotter.XY{{X: r.at, Y: float64(len(bars)) - 0.5 - 0.45*float64(i)}}, Labels: []string{r.name + " "}})
		must(err)
		name.TextStyle[0].Color = mark
		name.TextStyle[0].Font.Size = vg.Points(7)
		name.TextStyle[0].XAlign = draw.XRight
		name.TextStyle[0].YAlign = draw.YTop
		p.Add(name)
	}
	p.X.Max = top * 1.18 // room for the value labels
	p.X.Tick.Marker = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		ticks := plot.DefaultTicks{}.Ticks(lo, hi)
		for i := range ticks {
			if ticks[i].Label != "" {
				ticks[i].Label = grouped(ticks[i].Value)
			}
		}
		return ticks
	})
	p.NominalY(names...)
	return p
}

// thousands writes a rate rounded, with commas between groups of three digits.
func thousands(n float64) string { return grouped(n) + "/s" }

// grouped writes n rounded, with commas between groups of three digits.
func grouped(n float64) string {
	s := fmt.Sprintf("%.0f", n)
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}
