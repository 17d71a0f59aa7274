// Command etcd runs a single-member etcd in-process (go.etcd.io/etcd/server/v3/embed) for
// the test control plane that scripts/kube-cluster.sh starts. It listens on 127.0.0.1 only,
// on free ports it picks itself (so two clusters never clash), keeps its data under
// --data-dir, and writes its client URL to --url-file once it serves. SIGTERM or SIGINT stops
// it cleanly. Debian's etcd is older than the API server supports, hence this build.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "directory for etcd's data (required)")
	urlFile := flag.String("url-file", "", "file to write the client URL to once etcd serves (required)")
	logLevel := flag.String("log-level", "warn", "debug, info, warn or error")
	flag.Parse()
	if *dataDir == "" || *urlFile == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: etcd --data-dir DIR --url-file FILE [--log-level LEVEL]")
		os.Exit(2)
	}
	if err := run(*dataDir, *urlFile, *logLevel); err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		os.Exit(1)
	}
}

func run(dataDir, urlFile, logLevel string) error {
	// Ports are new on every start, so a member stored by an earlier run would not match.
	if entries, err := os.ReadDir(dataDir); err == nil && len(entries) > 0 {
		return fmt.Errorf("data dir %s holds an earlier member; give an empty or missing directory", dataDir)
	}
	var e *embed.Etcd
	var err error
	// A free port is found by binding 127.0.0.1:0 and closing it; another process may take
	// it before etcd binds it, so try again with new ports a few times.
	for attempt := 0; attempt < 5; attempt++ {
		e, err = start(dataDir, logLevel)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		return err
	}
	defer e.Close()

	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fmt.Errorf("etcd failed before it was ready: %w", err)
	case <-time.After(60 * time.Second):
		return errors.New("etcd was not ready within 60 s")
	}
	clientURL := "http://" + e.Clients[0].Addr().String()
	if err := writeAtomic(urlFile, clientURL+"\n"); err != nil {
		return err
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
		return nil
	case err := <-e.Err():
		return fmt.Errorf("etcd stopped: %w", err)
	}
}

func start(dataDir, logLevel string) (*embed.Etcd, error) {
	clientURL, err := freeURL()
	if err != nil {
		return nil, err
	}
	peerURL, err := freeURL()
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = "gpuslice-test"
	cfg.Dir = dataDir
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = logLevel
	cfg.LogOutputs = []string{"stderr"}
	// A throw-away test store: skipping fsync keeps the suite fast on slow disks.
	cfg.UnsafeNoFsync = true
	return embed.StartEtcd(cfg)
}

// freeURL returns http://127.0.0.1:PORT for a port that was free a moment ago.
func freeURL() (*url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cannot find a free port on 127.0.0.1: %w", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return nil, err
	}
	return url.Parse("http://" + addr)
}

// writeAtomic replaces path with content: a temporary file, fsync, rename, fsync of the directory.
func writeAtomic(path, content string) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("cannot create a temporary file in %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(content); err != nil {
		tmp.Close()
		return fmt.Errorf("cannot write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("cannot fsync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("cannot rename %s to %s: %w", tmp.Name(), path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("cannot fsync %s: %w", dir, err)
	}
	return nil
}
