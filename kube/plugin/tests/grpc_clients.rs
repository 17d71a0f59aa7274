//! Both plugin sockets answer standard gRPC clients whatever `:authority` they send: Python's
//! grpcio (Debian's python3-grpcio) dials each unix socket with the socket path as its
//! authority — as the kubelet's registration client does — and calls GetInfo on the
//! registration socket and NodePrepareResources/NodeUnprepareResources on the DRA socket.
//! A server that handed such requests to h2 directly reset the streams (PROTOCOL_ERROR).

use crate::support;

use std::process::Command;

use support::fakeapi::FakeApi;
use support::Node;

/// Calls each socket with `grpc.default_authority` set to the socket's path and prints what
/// came back; exits non-zero with the gRPC status on a failed call.
const CLIENT: &str = r#"
import sys, grpc
reg, dra = sys.argv[1], sys.argv[2]
def call(sock, method, body):
    ch = grpc.insecure_channel("unix:" + sock, options=[("grpc.default_authority", sock)])
    f = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        return f(body, timeout=10)
    except grpc.RpcError as e:
        sys.exit("%s on %s: %s %s" % (method, sock, e.code(), e.details()))
info = call(reg, "/pluginregistration.Registration/GetInfo", b"")
print("GetInfo", info.hex())
# NodePrepareResourcesRequest{claims: [Claim{namespace: "ns", uid: "uid-ghost", name: "ghost"}]}
claim = b"\x0a\x02ns" + b"\x12\x09uid-ghost" + b"\x1a\x05ghost"
req = b"\x0a" + bytes([len(claim)]) + claim
print("Prepare", call(dra, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", req).hex())
print("Unprepare", call(dra, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources", req).hex())
"#;

#[test]
fn python_grpcio_sending_the_socket_path_as_authority_is_served_on_both_sockets() {
    let api = FakeApi::start();
    let tmp = tempfile::tempdir().unwrap();
    let n = Node::new("node-a", &[16], api.kubeconfig(tmp.path()));
    let p = n.start();
    // Debian's interpreter, which python3-grpcio installs into (not whatever python3 is first
    // on PATH).
    let out = Command::new("/usr/bin/python3")
        .args(["-c", CLIENT])
        .arg(&p.reg)
        .arg(&p.dra)
        .output()
        .expect("python3 (with python3-grpcio: scripts/install-deps.sh)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    // GetInfo names the driver; prepare of an unknown claim answers under its UID (an error
    // naming the claim), unprepare of it succeeds.
    let line = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {stdout}"))
            .trim()
            .to_string()
    };
    assert!(line("GetInfo ").contains(&hex("gpuslice.io")), "{stdout}");
    let prepare = line("Prepare ");
    assert!(prepare.contains(&hex("uid-ghost")), "{stdout}");
    assert!(prepare.contains(&hex("does not exist")), "{stdout}");
    assert!(line("Unprepare ").contains(&hex("uid-ghost")), "{stdout}");
    p.stop().unwrap();
}
