package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/gateway"
	"github.com/meshtun/meshtun/tun"
)

// defaultConfig is where a node's config lives.
const defaultConfig = "/etc/meshtun/gateway.toml"

// load is the one path from a file to a gateway ready to run: parse,
// defaults, every semantic check, certificate files, then everything
// gateway.New checks. `run` and `validate` both go through it, so validate
// accepts exactly what run accepts. The config's own errors are printed
// to stderr (all of them) and reported as exit status 1.
func load(path string, stderr io.Writer, log func(*config.Config) hclog.Logger) (*gateway.Gateway, *config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, nil, exitError{1}
	}
	var l hclog.Logger
	if log != nil {
		l = log(cfg)
	}
	g, err := gateway.New(cfg, l)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, nil, exitError{1}
	}
	return g, cfg, nil
}

func cmdValidate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("validate", stderr)
	path := fs.String("config", defaultConfig, "the gateway's TOML config file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	_, cfg, err := load(*path, stderr, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: ok (%d peers, %d workloads, %d services, %d policies)\n",
		*path, len(cfg.Peers), len(cfg.Workloads), len(cfg.Services), len(cfg.Policies))
	return nil
}

func cmdRun(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("run", stderr)
	path := fs.String("config", defaultConfig, "the gateway's TOML config file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var log hclog.Logger
	g, cfg, err := load(*path, stderr, func(cfg *config.Config) hclog.Logger {
		log = newLogger(cfg, stderr)
		return log
	})
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		// A second signal while draining: stop now.
		<-ctx.Done()
		stop()
		again := make(chan os.Signal, 1)
		signal.Notify(again, syscall.SIGTERM, syscall.SIGINT)
		<-again
		log.Warn("second signal: exiting without draining")
		os.Exit(1)
	}()
	log.Info("starting", "config", *path, "name", cfg.Gateway.Name)
	if err := g.Run(ctx); err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}

func cmdCleanup(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("cleanup", stderr)
	path := fs.String("config", defaultConfig, "the gateway's TOML config file")
	name := fs.String("tun", "", "the device name (default: tun.name from the config)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dev := *name
	if dev == "" {
		data, err := os.ReadFile(*path)
		if err != nil {
			return err
		}
		// Parse, not Load: cleanup must work even when the certificates
		// are gone.
		cfg, err := config.Parse(data, *path)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return exitError{1}
		}
		dev = cfg.TUN.Name
	}
	if err := tun.Cleanup(dev); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "removed %s and meshtun's routes and rules\n", dev)
	return nil
}

// newLogger builds the one root logger, from [log].
func newLogger(cfg *config.Config, w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       "meshtun",
		Level:      hclog.LevelFromString(cfg.Log.Level),
		Output:     w,
		JSONFormat: cfg.Log.Format == "json",
	})
}
