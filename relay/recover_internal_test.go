package relay

import "testing"

func TestServerMajor(t *testing.T) {
	for in, want := range map[string]int{
		"17.10":                          17,
		"15.18 (Debian 15.18-0+deb12u1)": 15,
		"18beta1":                        18,
		"":                               0,
		"x":                              0,
	} {
		if got := serverMajor(in); got != want {
			t.Errorf("serverMajor(%q) = %d, want %d", in, got, want)
		}
	}
}
