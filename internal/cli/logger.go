package cli

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/lmittmann/tint"
)

// Log formats accepted by NewLogger.
const (
	LogFormatAuto = "auto" // text with colour on a terminal, JSON otherwise
	LogFormatText = "text"
	LogFormatJSON = "json"
)

// Log is the --log-format and --log-level settings.
type Log struct {
	Format, Level string
}

// Register binds the settings to f.
func (l *Log) Register(f *Flags) {
	f.StringVar(&l.Format, "log-format", LogFormatAuto, "auto, text or json")
	f.StringVar(&l.Level, "log-level", "info", "debug, info, warn or error")
}

// Logger validates the settings and returns the logger writing to w.
func (l *Log) Logger(w io.Writer) (*slog.Logger, error) {
	return NewLogger(w, l.Format, l.Level)
}

// NewLogger returns the binaries' logger: tint's coloured text for people,
// JSON lines for machines.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, Usagef("--log-level %q: want debug, info, warn or error", level)
	}
	terminal := isTerminal(w)
	switch strings.ToLower(format) {
	case LogFormatAuto, "":
		if !terminal {
			return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl})), nil
		}
		fallthrough
	case LogFormatText:
		return slog.New(tint.NewTextHandler(w, &tint.Options{Level: lvl, TimeFormat: time.TimeOnly, NoColor: !terminal})), nil
	case LogFormatJSON:
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl})), nil
	}
	return nil, Usagef("--log-format %q: want auto, text or json", format)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
