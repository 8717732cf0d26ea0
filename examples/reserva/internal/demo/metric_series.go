package demo

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// metricSeries are the series of one metric on a /metrics page, each with
// its labels.
type metricSeries []metricSample

type metricSample struct {
	labels map[string]string
	value  float64
}

// scrapeSeries reads the series of metric name from a /metrics page.
func scrapeSeries(url, name string) (metricSeries, error) {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", url, resp.Status)
	}
	return parseSeries(resp.Body, name)
}

// parseSeries reads the series of metric name from Prometheus' text
// format.
func parseSeries(r io.Reader, name string) (metricSeries, error) {
	var out metricSeries
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		s := metricSample{labels: map[string]string{}}
		if rest[0] == '{' {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				continue
			}
			s.labels = parseLabels(rest[1:end])
			rest = rest[end+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		s.value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// parseLabels reads `a="x",b="y"`; a value may hold escaped quotes.
func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return out
		}
		key := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				if s[i] == 'n' {
					val.WriteByte('\n')
					continue
				}
			}
			val.WriteByte(s[i])
		}
		out[key] = val.String()
		s = strings.TrimPrefix(s[min(i+1, len(s)):], ",")
	}
	return out
}

// sum adds up the series whose labels have the given values, given as
// name, value pairs.
func (ms metricSeries) sum(labels ...string) float64 {
	var t float64
	for _, s := range ms {
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			if s.labels[labels[i]] != labels[i+1] {
				match = false
				break
			}
		}
		if match {
			t += s.value
		}
	}
	return t
}

// scrapeAll reads metric name from every address's /metrics page and
// puts the series together; a page that does not answer is left out.
func scrapeAll(addrs []string, name string) metricSeries {
	var out metricSeries
	for _, a := range addrs {
		ms, err := scrapeSeries("http://"+a+"/metrics", name)
		if err == nil {
			out = append(out, ms...)
		}
	}
	return out
}
