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

// load is the one path from a file to a checked config: run, validate and
// cleanup all go through it.
func load(path string) (*config.Config, error) {
	return config.Load(path)
}

func cmdValidate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("validate", stderr)
	path := fs.String("config", "/etc/meshtun/gateway.toml", "the gateway's TOML config file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitError{1}
	}
	// The same checks run performs before it touches the system.
	if _, err := gateway.New(cfg, nil); err != nil {
		fmt.Fprintln(stderr, err)
		return exitError{1}
	}
	fmt.Fprintf(stdout, "%s: ok (%d peers, %d workloads, %d services, %d policies)\n",
		*path, len(cfg.Peers), len(cfg.Workloads), len(cfg.Services), len(cfg.Policies))
	return nil
}

func cmdRun(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("run", stderr)
	path := fs.String("config", "/etc/meshtun/gateway.toml", "the gateway's TOML config file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitError{1}
	}
	log := newLogger(cfg, stderr)
	g, err := gateway.New(cfg, log)
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
	path := fs.String("config", "/etc/meshtun/gateway.toml", "the gateway's TOML config file")
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
	fmt.Fprintf(stdout, "removed %s and meshtun's routes\n", dev)
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
