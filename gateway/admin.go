package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
)

// adminHandler serves the admin listener, which binds to localhost by
// default:
//
//   - GET /config_dump: the configuration in force (after any reload), as JSON
//     with gateway.toml's key names. The config holds only the paths of the
//     certificate and key files, never their contents, so no key material
//     can appear here.
//   - GET /logging shows the log level; POST or PUT /logging?level=debug
//     changes it at once for every logger of the process (the access log
//     too, which writes at INFO and WARN).
//   - /debug/pprof/: Go's profiler, to see where a gateway's CPU and memory
//     go (the bench's missed targets were diagnosed with it).
func (g *Gateway) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /config_dump", func(w http.ResponseWriter, r *http.Request) {
		b, err := json.MarshalIndent(config.Dump(g.snapshot().cfg), "", "  ")
		if err != nil {
			http.Error(w, "config dump: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(append(b, '\n'))
	})
	mux.HandleFunc("/logging", g.serveLogging)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// logLevels are the levels /logging accepts: log.level's values.
var logLevels = []string{"trace", "debug", "info", "warn", "error"}

// serveLogging shows or sets the level of the process's loggers. The
// gateway's logger is a Named child of the root logger and shares its
// level (hclog's default), so setting it here sets it everywhere.
func (g *Gateway) serveLogging(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPost, http.MethodPut:
		v := r.URL.Query().Get("level")
		lvl := hclog.LevelFromString(v)
		if v == "" || lvl == hclog.NoLevel || lvl == hclog.Off {
			http.Error(w, fmt.Sprintf("logging: level %q: want one of %s, as in /logging?level=debug",
				v, strings.Join(logLevels, ", ")), http.StatusBadRequest)
			return
		}
		old := g.log.GetLevel()
		g.log.SetLevel(lvl)
		g.log.Info("log level changed", "from", levelName(old), "to", levelName(lvl))
	default:
		w.Header().Set("Allow", "GET, HEAD, POST, PUT")
		http.Error(w, "logging: use GET to read the level, POST or PUT ?level=LEVEL to set it", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "level: %s\n", levelName(g.log.GetLevel()))
}

func levelName(l hclog.Level) string {
	return strings.ToLower(l.String())
}
