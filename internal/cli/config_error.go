package cli

import "regexp"

// configField finds the field an engine's validation error is about:
// "Config.MaxInFlightRecords", "PruneConfig.Retention", "RecoverOpts.Margin".
// The first one named is the subject; others may follow as its bounds.
var configField = regexp.MustCompile(`\b[A-Za-z]*(?:Config|Opts)(?:\.[A-Z][A-Za-z]*)+`)

// ConfigError returns err, an engine's refusal of its configuration, as a
// usage error that also names the flag and environment variable that set
// the field, since an operator knows --max-in-flight, not
// Config.MaxInFlightRecords. flags maps fields to flags
// ("Config.MaxInFlightRecords": "max-in-flight"); a field it lacks, and a
// nil err, are returned as they are (a usage error all the same).
func ConfigError(err error, flags map[string]string) error {
	if err == nil {
		return nil
	}
	if name, ok := flags[configField.FindString(err.Error())]; ok {
		return Usagef("--%s (%s): %w", name, EnvName(name), err)
	}
	return Usage(err)
}
