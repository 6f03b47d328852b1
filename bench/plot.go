package main

import (
	"errors"
	"flag"
	"fmt"
	"image/color"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// plots draws the PNGs of BENCHMARKS.md from the JSON results: a box plot
// (with every trial as a dot) of the handoff and takeover times per
// system, and the scale runs against N.
func plots(args []string) error {
	fs := flag.NewFlagSet("plot", flag.ContinueOnError)
	in := fs.String("in", "results", "directory of the JSON results")
	out := fs.String("out", "plots", "directory of the PNGs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	drawn := 0
	for _, kind := range []trialKind{handoff, takeover} {
		var r trialsResult
		if err := readJSON(filepath.Join(*in, string(kind)+".json"), &r); errors.Is(err, os.ErrNotExist) {
			continue
		} else if err != nil {
			return err
		}
		if err := trialsPlot(r, filepath.Join(*out, string(kind)+".png")); err != nil {
			return err
		}
		drawn++
	}
	files, err := filepath.Glob(filepath.Join(*in, "scale-*.json"))
	if err != nil {
		return err
	}
	var series []scaleResult
	for _, f := range files {
		var r scaleResult
		if err := readJSON(f, &r); err != nil {
			return err
		}
		series = append(series, r)
	}
	if len(series) > 0 {
		if err := scalePlots(series, *out); err != nil {
			return err
		}
		drawn++
	}
	if drawn == 0 {
		return fmt.Errorf("no results in %s: run go run . compare or scale first", *in)
	}
	return nil
}

func trialsPlot(r trialsResult, path string) error {
	p := plot.New()
	what := map[trialKind]string{
		handoff:  "Handoff after a clean release",
		takeover: "Takeover after a crash",
	}[r.Kind]
	var ttl, hb float64
	if len(r.Systems) > 0 {
		ttl, hb = r.Systems[0].TTLMs, r.Systems[0].HeartbeatMs
	}
	p.Title.Text = fmt.Sprintf("%s (%d members, LeaseTTL %v, heartbeat %v)", what, slots,
		time.Duration(ttl*float64(time.Millisecond)), time.Duration(hb*float64(time.Millisecond)))
	if r.Kind == takeover && ttl > 0 {
		// The lease's length, for reference: a crash right after a renew.
		line := plotter.NewFunction(func(float64) float64 { return ttl })
		line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		line.Color = color.Gray{Y: 120}
		p.Add(line)
		p.Legend.Add("LeaseTTL", line)
		p.Legend.Top, p.Legend.Left = false, true
	}
	p.Y.Label.Text = "ms until another member leads"
	p.Y.Min = 0
	rng := rand.New(rand.NewPCG(1, 2)) // jitter of the dots only
	var names []string
	for i, s := range r.Systems {
		var vals plotter.Values
		var dots plotter.XYs
		for _, t := range s.Trials {
			vals = append(vals, t.Ms)
			dots = append(dots, plotter.XY{X: float64(i) + 0.3 + 0.12*(rng.Float64()-0.5), Y: t.Ms})
		}
		if len(vals) == 0 {
			continue
		}
		box, err := plotter.NewBoxPlot(vg.Points(22), float64(i), vals)
		if err != nil {
			return err
		}
		box.FillColor = plotutil.Color(i)
		sc, err := plotter.NewScatter(dots)
		if err != nil {
			return err
		}
		sc.GlyphStyle.Radius = vg.Points(1.5)
		sc.GlyphStyle.Shape = draw.CircleGlyph{}
		sc.GlyphStyle.Color = color.Gray{Y: 80}
		p.Add(box, sc)
		names = append(names, fmt.Sprintf("%s (n=%d)", s.System, len(vals)))
	}
	p.NominalX(names...)
	// Many systems' names would overlap side by side: slant them.
	p.X.Tick.Label.Rotation = math.Pi / 6
	p.X.Tick.Label.XAlign, p.X.Tick.Label.YAlign = draw.XRight, draw.YCenter
	p.Add(plotter.NewGrid())
	return save(p, path, 0.8*float64(max(len(names), 6))+2, 4.2)
}

func scalePlots(series []scaleResult, dir string) error {
	type line struct {
		label string
		y     func(scalePoint) float64 // 0: not measured at that N
	}
	draws := []struct {
		file, title, ylabel string
		legendTop           bool
		lines               []line
	}{
		{"scale-statements.png", "Load on PostgreSQL against members (one process)", "statements per second", true,
			[]line{
				{"client-side count", func(p scalePoint) float64 { return p.ClientPS }},
				// Polling: one per member per heartbeat; listening
				// (-pg-handoff notify): the leader's one per heartbeat plus
				// one per follower per TTL.
				{"expected", func(p scalePoint) float64 {
					if p.HeartbeatMs == 0 || p.TTLMs == 0 {
						return 0
					}
					if p.PgHandoff == pgHandoffNotify {
						return 1000/p.HeartbeatMs + float64(p.N-1)*1000/p.TTLMs
					}
					return float64(p.N) * 1000 / p.HeartbeatMs
				}},
			}},
		{"scale-takeover.png", "Crash takeover against members", "ms until another member leads", false,
			[]line{
				{"p50", func(p scalePoint) float64 { return p.Takeover.P50 }},
				{"p99", func(p scalePoint) float64 { return p.Takeover.P99 }},
			}},
		{"scale-handoff.png", "Handoff after Shutdown against members", "ms until another member leads", true,
			[]line{
				{"p50", func(p scalePoint) float64 { return p.Handoff.P50 }},
				{"p99", func(p scalePoint) float64 { return p.Handoff.P99 }},
			}},
	}
	for _, d := range draws {
		p := plot.New()
		p.Title.Text = d.title
		p.X.Label.Text = "members (N), log scale; series: LeaseTTL/heartbeat"
		p.Y.Label.Text = d.ylabel
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = nTicks(series)
		p.Y.Min = 0
		p.Legend.Top = d.legendTop
		p.Legend.Left = true
		k := 0
		for si, s := range series {
			for li, l := range d.lines {
				var xys plotter.XYs
				for _, pt := range s.Points {
					if y := l.y(pt); y > 0 {
						xys = append(xys, plotter.XY{X: float64(pt.N), Y: y})
					}
				}
				if len(xys) == 0 {
					continue
				}
				ln, pts, err := plotter.NewLinePoints(xys)
				if err != nil {
					return err
				}
				ln.Color, pts.Color = plotutil.Color(k), plotutil.Color(k)
				pts.Shape = plotutil.Shape(si)
				ln.Dashes = plotutil.Dashes(li)
				p.Add(ln, pts)
				p.Legend.Add(fmt.Sprintf("%s %s, %s", s.Name, seriesTimings(s), l.label), ln, pts)
				k++
			}
		}
		if d.legendTop {
			p.Y.Max *= 1.5 // room for the legend above the lines
		}
		p.Add(plotter.NewGrid())
		if err := save(p, filepath.Join(dir, d.file), 7, 3.6); err != nil {
			return err
		}
	}
	return nil
}

// seriesTimings is a series' LeaseTTL/heartbeat, as "2s/200ms".
func seriesTimings(s scaleResult) string {
	if len(s.Points) == 0 {
		return ""
	}
	p := s.Points[0]
	return fmt.Sprintf("%v/%v", time.Duration(p.TTLMs*float64(time.Millisecond)), time.Duration(p.HeartbeatMs*float64(time.Millisecond)))
}

// nTicks marks every N that was run.
func nTicks(series []scaleResult) plot.ConstantTicks {
	var ns []int
	for _, s := range series {
		for _, p := range s.Points {
			if !slices.Contains(ns, p.N) {
				ns = append(ns, p.N)
			}
		}
	}
	slices.Sort(ns)
	var ticks plot.ConstantTicks
	for _, n := range ns {
		ticks = append(ticks, plot.Tick{Value: float64(n), Label: fmt.Sprint(n)})
	}
	return ticks
}

func save(p *plot.Plot, path string, w, h float64) error {
	if err := p.Save(vg.Length(w)*vg.Inch, vg.Length(h)*vg.Inch, path); err != nil {
		return err
	}
	fmt.Printf("wrote %s\n", path)
	return nil
}
