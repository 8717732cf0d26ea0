package cli

import (
	"cmp"
	"runtime/debug"
	"strings"
)

// ferryModule is the module path of Ferry; a worker binary built from
// another module (workercli.App) names the Ferry version it was built with.
const ferryModule = "github.com/ferryhq/ferry"

// IsVersion reports whether arg, where a subcommand is expected, asks for
// the version: "version", or -version with one or two dashes.
func IsVersion(arg string) bool {
	switch arg {
	case "version", "-version", "--version":
		return true
	}
	return false
}

// Version is the binary's version, from the build information the Go
// toolchain records: the module version for `go install ...@v0.1.0`,
// "(devel)" (or the pseudo-version Go 1.24+ derives from the checkout) for
// a build from source, then the commit, its time and "modified" when the
// build recorded them, then the Go version.
func Version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown: built without module support)"
	}
	return formatVersion(info)
}

func formatVersion(info *debug.BuildInfo) string {
	var b strings.Builder
	b.WriteString(cmp.Or(info.Main.Version, "(devel)"))
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	var vcs []string
	if rev := settings["vcs.revision"]; rev != "" {
		vcs = append(vcs, "commit "+rev)
	}
	if t := settings["vcs.time"]; t != "" {
		vcs = append(vcs, t)
	}
	if settings["vcs.modified"] == "true" {
		vcs = append(vcs, "modified")
	}
	if len(vcs) > 0 {
		b.WriteString(" (" + strings.Join(vcs, ", ") + ")")
	}
	if info.Main.Path != ferryModule {
		for _, d := range info.Deps {
			if d.Path != ferryModule {
				continue
			}
			if d.Replace != nil {
				d = d.Replace
			}
			b.WriteString(", ferry " + cmp.Or(d.Version, "(devel)"))
		}
	}
	if info.GoVersion != "" {
		b.WriteString(", " + info.GoVersion)
	}
	return b.String()
}
