// registrar serves the kubelet's plugin registration API (pluginregistration.v1) on
// <registration-dir>/<driver>-reg.sock for a DRA plugin whose DRA socket is --endpoint.
//
// It stands in for the gpuslice kubelet plugin's own registration socket on the test node:
// the kubelet's registration client (pkg/kubelet/pluginmanager, grpc.DialContext with a bare
// socket path) sends the socket path as the HTTP/2 :authority, which the Rust h2 server under
// tonic rejects with PROTOCOL_ERROR (hyperium/h2 pull 487), so the kubelet cannot register
// the plugin's own socket. The kubelet's DRA client dials "unix:" targets with authority
// "localhost", which the plugin serves fine.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type registrar struct {
	registerapi.UnimplementedRegistrationServer
	driver, endpoint string
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	log.Printf("GetInfo: %s at %s", r.driver, r.endpoint)
	return &registerapi.PluginInfo{
		Type:              registerapi.DRAPlugin,
		Name:              r.driver,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"v1.DRAPlugin"},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	log.Printf("NotifyRegistrationStatus: registered=%v error=%q", s.PluginRegistered, s.Error)
	return &registerapi.RegistrationStatusResponse{}, nil
}

func main() {
	dir := flag.String("registration-dir", "", "the directory the kubelet watches (its plugins_registry)")
	driver := flag.String("driver", "gpuslice.io", "the DRA driver name")
	endpoint := flag.String("endpoint", "", "the plugin's DRA socket")
	flag.Parse()
	if *dir == "" || *endpoint == "" {
		log.Fatal("--registration-dir and --endpoint are required")
	}
	sock := filepath.Join(*dir, *driver+"-reg.sock")
	// Created under a dot-name (the kubelet ignores those) and renamed into place.
	tmp := filepath.Join(*dir, "."+*driver+"-reg.sock.tmp")
	_ = os.Remove(tmp)
	l, err := net.Listen("unix", tmp)
	if err != nil {
		log.Fatalf("listen %s: %v", tmp, err)
	}
	if err := os.Rename(tmp, sock); err != nil {
		log.Fatalf("rename %s to %s: %v", tmp, sock, err)
	}
	s := grpc.NewServer()
	registerapi.RegisterRegistrationServer(s, &registrar{driver: *driver, endpoint: *endpoint})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		s.Stop()
	}()
	log.Printf("serving %s for %s (%s)", sock, *driver, *endpoint)
	if err := s.Serve(l); err != nil {
		log.Printf("serve: %v", err)
	}
	_ = os.Remove(sock)
}
