package cli

import (
	"runtime/debug"
	"testing"
)

// The version line reads the build information: the module version of
// `go install ...@v0.1.0`, "(devel)" for a build from source, the commit,
// its time and "modified" when recorded, and, for a worker built from an
// application's module, the Ferry version it was built with.
func TestVersionFromBuildInfo(t *testing.T) {
	t.Parallel()
	vcs := []debug.BuildSetting{
		{Key: "-buildmode", Value: "exe"},
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "077f4697c32783f334f196c8b571580f69b5f071"},
		{Key: "vcs.time", Value: "2026-12-02T02:05:19Z"},
	}
	cases := []struct {
		name string
		info debug.BuildInfo
		want string
	}{
		{"installed at a tag", debug.BuildInfo{
			GoVersion: "go1.26.8",
			Main:      debug.Module{Path: ferryModule, Version: "v0.1.0"},
		}, "v0.1.0, go1.26.8"},
		{"from source without vcs", debug.BuildInfo{
			GoVersion: "go1.26.8",
			Main:      debug.Module{Path: ferryModule, Version: "(devel)"},
		}, "(devel), go1.26.8"},
		{"no version at all", debug.BuildInfo{
			Main: debug.Module{Path: ferryModule},
		}, "(devel)"},
		{"from a clean checkout", debug.BuildInfo{
			GoVersion: "go1.26.8",
			Main:      debug.Module{Path: ferryModule, Version: "(devel)"},
			Settings:  append(vcs, debug.BuildSetting{Key: "vcs.modified", Value: "false"}),
		}, "(devel) (commit 077f4697c32783f334f196c8b571580f69b5f071, 2026-12-02T02:05:19Z), go1.26.8"},
		{"from a modified checkout", debug.BuildInfo{
			GoVersion: "go1.26.8",
			Main:      debug.Module{Path: ferryModule, Version: "v0.0.0-20261202020519-077f4697c327+dirty"},
			Settings:  append(vcs, debug.BuildSetting{Key: "vcs.modified", Value: "true"}),
		}, "v0.0.0-20261202020519-077f4697c327+dirty (commit 077f4697c32783f334f196c8b571580f69b5f071, 2026-12-02T02:05:19Z, modified), go1.26.8"},
		{"an application's worker", debug.BuildInfo{
			GoVersion: "go1.26.8",
			Main:      debug.Module{Path: "example.com/billing", Version: "v2.3.0"},
			Deps: []*debug.Module{
				{Path: "github.com/jackc/pgx/v5", Version: "v5.7.0"},
				{Path: ferryModule, Version: "v0.1.0"},
			},
		}, "v2.3.0, ferry v0.1.0, go1.26.8"},
		{"an application's worker on a replaced Ferry", debug.BuildInfo{
			GoVersion: "go1.26.8",
			Main:      debug.Module{Path: "example.com/billing", Version: "(devel)"},
			Deps: []*debug.Module{
				{Path: ferryModule, Version: "v0.1.0", Replace: &debug.Module{Path: "../ferry"}},
			},
		}, "(devel), ferry (devel), go1.26.8"},
	}
	for _, c := range cases {
		if got := formatVersion(&c.info); got != c.want {
			t.Errorf("%s: version %q, want %q", c.name, got, c.want)
		}
	}
}
