package inbox

import (
	"reflect"
	"regexp"
	"runtime"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A live migration's new channel is another cluster, reached with the
// brokers, TLS and SASL settings its fences carry (migration.Channel). Its
// clients are the worker's all the same: every other setting of
// Config.KafkaOpts (session timeout, heartbeat, client id, fetch sizes,
// logger, hooks...) must reach them too, or the group there behaves
// otherwise than on the old channel. Found in issue 21: with
// kgo.SessionTimeout(6s) in KafkaOpts, cluster A gave a killed worker's
// partitions away in 4-5 s and cluster B after 43-44 s (the default), and
// a rollback right after stalled both channels for over two minutes.

// channelKafkaOpts returns the options of a client of another channel:
// base (Config.KafkaOpts) without the options that say where the worker's
// own cluster is and how to authenticate there, then the channel's own.
func channelKafkaOpts(base, channel []kgo.Opt) []kgo.Opt {
	out := make([]kgo.Opt, 0, len(base)+len(channel))
	for _, o := range base {
		if !reachesCluster(o) {
			out = append(out, o)
		}
	}
	return append(out, slices.Clone(channel)...)
}

// clusterOpt names the franz-go options that choose a cluster and the
// credentials for it: they are the channel's, never the worker's own. The
// name is that of the option's constructor, which franz-go's options keep
// as the closure that applies them (kgo.DialTLS is DialTLSConfig's):
// "kgo.SeedBrokers.func1", or, inlined into a caller's closure,
// "caller.func2.SeedBrokers.1". An upgrade of franz-go or Go that changes
// this fails TestChannelKafkaOptsKeepAllButTheClustersAddressAndSecurity.
var clusterOpt = regexp.MustCompile(`\.(SeedBrokers|DialTLSConfig|Dialer|SASL)\.(func)?[0-9]+$`)

// reachesCluster reports whether o is one of clusterOpt's options.
func reachesCluster(o kgo.Opt) bool {
	fn, ok := optFunc(reflect.ValueOf(o))
	if !ok {
		return false
	}
	f := runtime.FuncForPC(fn.Pointer())
	return f != nil && clusterOpt.MatchString(f.Name())
}

// optFunc finds the function an option value holds, through the structs
// and interfaces that wrap it.
func optFunc(v reflect.Value) (reflect.Value, bool) {
	for v.Kind() == reflect.Interface || v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return reflect.Value{}, false
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Func:
		return v, !v.IsNil()
	case reflect.Struct:
		for i := range v.NumField() {
			if fn, ok := optFunc(v.Field(i)); ok {
				return fn, true
			}
		}
	}
	return reflect.Value{}, false
}
