package deploytest_test

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	// Grafana's variables ($__rate_interval, ${datasource}) are not PromQL.
	grafanaVarRE = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)
	// Label values and strings hold no metric names.
	stringRE = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	// Label matchers, ranges and subqueries, and the label lists of
	// aggregations and vector matching.
	matcherRE  = regexp.MustCompile(`\{[^}]*\}`)
	rangeRE    = regexp.MustCompile(`\[[^\]]*\]`)
	groupingRE = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	// A token: a name, or a number or duration (1e9, 0.99, 5m), which may
	// look like a name after its first character.
	tokenRE = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?[A-Za-z]*|\.[0-9]+`)
)

// keywords are PromQL's words that are neither functions nor metrics.
var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true, "without": true,
	"on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true,
}

// metricNames returns the series names a PromQL expression selects: every
// name that is not a function or aggregation (followed by "("), a
// keyword, a label or a literal. A histogram's series are named as they
// are exported (_bucket, _sum, _count), so they are checked as they stand.
func metricNames(expr string) []string {
	expr = grafanaVarRE.ReplaceAllString(expr, "x")
	expr = stringRE.ReplaceAllString(expr, `""`)
	expr = matcherRE.ReplaceAllString(expr, " ")
	expr = rangeRE.ReplaceAllString(expr, " ")
	expr = groupingRE.ReplaceAllString(expr, " ")
	var names []string
	for _, loc := range tokenRE.FindAllStringIndex(expr, -1) {
		tok := expr[loc[0]:loc[1]]
		if tok[0] >= '0' && tok[0] <= '9' || tok[0] == '.' || keywords[strings.ToLower(tok)] {
			continue
		}
		if rest := strings.TrimLeft(expr[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue // a function or an aggregation
		}
		if !slices.Contains(names, tok) {
			names = append(names, tok)
		}
	}
	return names
}

// labelValuesMetric returns the metric of a Grafana label_values(metric,
// label) query, "" for any other query.
func labelValuesMetric(query string) string {
	m := regexp.MustCompile(`^\s*label_values\(\s*([^,]+),`).FindStringSubmatch(query)
	if m == nil {
		return ""
	}
	return strings.TrimSpace(matcherRE.ReplaceAllString(m[1], ""))
}

// The extraction finds every metric of an expression and nothing else, so
// that the dashboard and rules test can neither miss a metric nor be
// satisfied by a function's name.
func TestMetricNames(t *testing.T) {
	t.Parallel()
	cases := []struct {
		expr string
		want []string
	}{
		{`ferry_relay_ready == 0`, []string{"ferry_relay_ready"}},
		{`absent(ferry_relay_ready{job="a b"})`, []string{"ferry_relay_ready"}},
		{`histogram_quantile(0.99, sum by (job, le) (rate(ferry_relay_commit_to_ack_seconds_bucket{job=~"$relay_job"}[$__rate_interval]))) > 1`,
			[]string{"ferry_relay_commit_to_ack_seconds_bucket"}},
		{"max without (instance, pod) (a_bytes) > 1e9\nand\nmax without (instance, pod) (deriv(a_bytes[30m] offset 5m)) > 0",
			[]string{"a_bytes"}},
		{`sum(rate(x_total[5m])) by (reason) / on (reason) group_left (y) sum(z_total) > bool 0.5`, []string{"x_total", "z_total"}},
		{`rate(process_cpu_seconds_total{job=~"${worker_job}", le="+Inf"}[1h:5m])`, []string{"process_cpu_seconds_total"}},
	}
	for _, c := range cases {
		if got := metricNames(c.expr); !slices.Equal(got, c.want) {
			t.Errorf("metricNames(%q) = %q, want %q", c.expr, got, c.want)
		}
	}
	if got := labelValuesMetric(`label_values(ferry_relay_ready{x="y"}, job)`); got != "ferry_relay_ready" {
		t.Errorf("labelValuesMetric = %q", got)
	}
}
