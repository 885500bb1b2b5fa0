package bench

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// Charts are drawn here as inline SVG, so the report needs no script and no
// network: it opens anywhere, and prints.

var palette = []string{"#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#4b5563"}

type point struct{ x, y float64 }

type series struct {
	name   string
	color  string
	points []point
	dashed bool
}

type chartFrame struct {
	w, h                   float64
	left, right, top, bott float64
	xmax, ymax             float64
	title, xlabel, ylabel  string
}

func (f *chartFrame) px(x float64) float64 {
	return f.left + x/f.xmax*(f.w-f.left-f.right)
}

func (f *chartFrame) py(y float64) float64 {
	return f.h - f.bott - y/f.ymax*(f.h-f.top-f.bott)
}

// niceMax rounds v up to 1, 2 or 5 × a power of ten, and returns the tick step.
func niceMax(v float64) (top, step float64) {
	if v <= 0 || math.IsNaN(v) {
		return 1, 0.25
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			top = m * p
			break
		}
	}
	step = top / 5
	return top, step
}

func fmtNum(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.1fk", v/1000)
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2g", v)
	}
}

func (f *chartFrame) open(b *strings.Builder) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" aria-label="%s">`,
		f.w, f.h, f.w, f.h, html.EscapeString(f.title))
	fmt.Fprintf(b, `<text x="%.0f" y="18" class="ct">%s</text>`, f.left, html.EscapeString(f.title))
	// Y grid and labels.
	_, ystep := niceMax(f.ymax)
	for y := 0.0; y <= f.ymax+ystep/2; y += ystep {
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" class="grid"/>`, f.left, f.w-f.right, f.py(y), f.py(y))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" class="yl">%s</text>`, f.left-6, f.py(y)+4, fmtNum(y))
	}
	fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" class="axis"/>`, f.left, f.w-f.right, f.py(0), f.py(0))
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" class="al">%s</text>`, (f.left+f.w-f.right)/2, f.h-6, html.EscapeString(f.xlabel))
	fmt.Fprintf(b, `<text transform="translate(14 %.1f) rotate(-90)" class="al">%s</text>`, (f.top+f.h-f.bott)/2, html.EscapeString(f.ylabel))
}

func (f *chartFrame) legend(b *strings.Builder, ss []series) {
	x := f.left + 10
	for _, s := range ss {
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="3"%s/>`, x, x+18, f.top+8, f.top+8, s.color, dash)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" class="lg">%s</text>`, x+22, f.top+12, html.EscapeString(s.name))
		x += 30 + 7*float64(len(s.name))
	}
}

// lineChart draws series over a linear x axis.
func lineChart(title, xlabel, ylabel string, ss []series) string {
	f := &chartFrame{w: 540, h: 300, left: 56, right: 16, top: 30, bott: 40, title: title, xlabel: xlabel, ylabel: ylabel}
	for _, s := range ss {
		for _, p := range s.points {
			f.xmax, f.ymax = max(f.xmax, p.x), max(f.ymax, p.y)
		}
	}
	f.ymax, _ = niceMax(f.ymax * 1.15)
	f.xmax, _ = niceMax(f.xmax)
	var b strings.Builder
	f.open(&b)
	_, xstep := niceMax(f.xmax)
	for x := 0.0; x <= f.xmax+xstep/2; x += xstep {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="xl">%s</text>`, f.px(x), f.h-f.bott+16, fmtNum(x))
	}
	for _, s := range ss {
		var pts []string
		for _, p := range s.points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", f.px(p.x), f.py(p.y)))
		}
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`, s.color, dash, strings.Join(pts, " "))
	}
	f.legend(&b, ss)
	b.WriteString(`</svg>`)
	return b.String()
}

// barGroup is one category of a grouped bar chart.
type barGroup struct {
	label  string
	values []float64 // one per series name
}

// barChart draws grouped vertical bars, values printed on top.
func barChart(title, ylabel string, names []string, groups []barGroup, refLine float64, refName string) string {
	f := &chartFrame{w: 540, h: 300, left: 56, right: 16, top: 30, bott: 46, title: title, ylabel: ylabel}
	for _, g := range groups {
		for _, v := range g.values {
			f.ymax = max(f.ymax, v)
		}
	}
	f.ymax = max(f.ymax, refLine)
	f.ymax, _ = niceMax(f.ymax * 1.15)
	var b strings.Builder
	f.open(&b)
	plotW := f.w - f.left - f.right
	gw := plotW / float64(max(1, len(groups)))
	bw := min(60, gw*0.8/float64(max(1, len(names))))
	for gi, g := range groups {
		x0 := f.left + float64(gi)*gw + (gw-bw*float64(len(names)))/2
		for si, v := range g.values {
			x := x0 + float64(si)*bw
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`,
				x+1, f.py(v), bw-2, f.py(0)-f.py(v), palette[si%len(palette)], html.EscapeString(g.label), html.EscapeString(names[si]), fmtNum(v))
			if v > 0 && bw >= 14 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="bv">%s</text>`, x+bw/2, f.py(v)-3, fmtNum(v))
			}
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="xl">%s</text>`, f.left+float64(gi)*gw+gw/2, f.h-f.bott+16, html.EscapeString(g.label))
	}
	if refLine > 0 {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#111" stroke-width="1.5" stroke-dasharray="6 4"/>`, f.left, f.w-f.right, f.py(refLine), f.py(refLine))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="ref">%s</text>`, f.w-f.right-4, f.py(refLine)-4, html.EscapeString(refName))
	}
	if len(names) > 1 {
		var ss []series
		for i, n := range names {
			ss = append(ss, series{name: n, color: palette[i%len(palette)]})
		}
		f.legend(&b, ss)
	}
	b.WriteString(`</svg>`)
	return b.String()
}
