package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// A summary describes a sample of durations in milliseconds. Percentiles
// are nearest-rank: with 30 samples p99 is the largest, so p99 and max
// agree until a run has more than 100 samples.
type summary struct {
	N    int     `json:"n"`
	Min  float64 `json:"minMs"`
	P50  float64 `json:"p50Ms"`
	P90  float64 `json:"p90Ms"`
	P99  float64 `json:"p99Ms"`
	Max  float64 `json:"maxMs"`
	Mean float64 `json:"meanMs"`
}

func summarize(ms []float64) summary {
	if len(ms) == 0 {
		return summary{}
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	return summary{
		N:    len(s),
		Min:  s[0],
		P50:  percentile(s, 50),
		P90:  percentile(s, 90),
		P99:  percentile(s, 99),
		Max:  s[len(s)-1],
		Mean: sum / float64(len(s)),
	}
}

// percentile returns the nearest-rank p-th percentile of sorted s.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// median returns the median of s, the mean of the middle two for an even
// count.
func median(s []float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	c := slices.Clone(s)
	slices.Sort(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fmtMs formats milliseconds for a table: three significant digits.
func fmtMs(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
