package main

import (
	"fmt"
	"html"
	"os"
	"strings"
	"time"
)

// Chart geometry: one plot of every series, each scaled to its own
// maximum, with a legend that gives the maxima.
const (
	chartW, chartH     = 900, 420
	plotX, plotY       = 60, 20
	plotW, plotH       = 560, 340
	legendX, legendRow = 640, 22
)

var chartColors = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"}

// writeSoakChart draws the samples of r as an SVG file at path: each
// series a line scaled to its maximum over the run (the legend gives it),
// the warm-up shaded, the first and last thirds of the measured span
// marked.
func writeSoakChart(path string, r *soakResult) error {
	if len(r.Samples) < 2 {
		return fmt.Errorf("chart: %d samples", len(r.Samples))
	}
	end := r.Samples[len(r.Samples)-1].At
	x := func(at time.Duration) float64 { return plotX + plotW*float64(at)/float64(end) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="#eee"/>`+"\n", plotX, plotY, x(r.Warmup)-plotX, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#666">warm-up</text>`+"\n", plotX+4, plotY+14)
	span := end - r.Warmup
	for _, at := range []time.Duration{r.Warmup + span/3, end - span/3} {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999" stroke-dasharray="4 4"/>`+"\n", x(at), plotY, x(at), plotY+plotH)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", plotX, plotY, plotW, plotH)
	for m := time.Duration(0); m <= end; m += chartTick(end) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%v</text>`+"\n", x(m), plotY+plotH+16, m)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">time since start</text>`+"\n", plotX+plotW/2, plotY+plotH+34)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">max</text><text x="%d" y="%d" text-anchor="end">0</text>`+"\n",
		plotX-6, plotY+10, plotX-6, plotY+plotH)
	for i, series := range soakSeries {
		top := maxOf(r.Samples, series.value)
		var pts strings.Builder
		for _, s := range r.Samples {
			y := float64(plotY + plotH)
			if top > 0 {
				y -= plotH * series.value(s) / top
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(s.At), y)
		}
		color := chartColors[i%len(chartColors)]
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", color, strings.TrimSpace(pts.String()))
		ly := plotY + 10 + i*legendRow
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", legendX, ly-4, legendX+18, ly-4, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s (max %s)</text>`+"\n", legendX+24, ly, html.EscapeString(series.name), chartValue(top, series.unit))
	}
	b.WriteString("</svg>\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	return nil
}

// chartTick returns the spacing of the time axis' labels: about six.
func chartTick(end time.Duration) time.Duration {
	for _, t := range []time.Duration{10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute} {
		if end/t <= 8 {
			return t
		}
	}
	return 30 * time.Minute
}

func chartValue(v float64, unit string) string {
	if unit == "" {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}
