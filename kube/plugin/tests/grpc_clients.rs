//! Both plugin sockets answer standard gRPC clients whatever `:authority` they send: Python's
//! grpcio (Debian's python3-grpcio, 1.51) sends `localhost` when it dials `unix:PATH` or
//! `unix:///PATH`, and the socket path when told to (`grpc.default_authority`, the form the
//! kubelet's own registration client sends and grpc-go sends for a bare path with a custom
//! dialer). The path form is the one h2 refuses: the first test shows a tonic server reached
//! directly resets that very call (RST_STREAM, PROTOCOL_ERROR); the plugin, which relays both
//! sockets (`h2_relay`), answers it on each, so removing the relay from either socket fails
//! the second test.

use crate::support;

use std::process::Command;
use std::sync::Arc;

use gpuslice_fakeapi::FakeApi;
use gpuslice_kube::proto::registration::registration_server::RegistrationServer;
use gpuslice_kube::registration::RegistrationService;
use support::Node;
use tokio::net::UnixListener;
use tokio::sync::Notify;
use tokio_stream::wrappers::UnixListenerStream;

/// Calls each socket in both grpcio forms (`path`: `grpc.default_authority` set to the
/// socket's path; `default`: grpcio's own authority) and prints what came back; exits
/// non-zero with the gRPC status on a failed call. Arguments: the registration socket, then
/// the DRA socket or `-` for none.
const CLIENT: &str = r#"
import sys, grpc
reg, dra = sys.argv[1], sys.argv[2]
def call(form, sock, method, body):
    opts = [("grpc.default_authority", sock)] if form == "path" else []
    ch = grpc.insecure_channel("unix:" + sock, options=opts)
    f = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        return f(body, timeout=10)
    except grpc.RpcError as e:
        sys.exit("%s (%s authority) on %s: %s %s" % (method, form, sock, e.code(), e.details()))
# NodePrepareResourcesRequest{claims: [Claim{namespace: "ns", uid: "uid-ghost", name: "ghost"}]}
claim = b"\x0a\x02ns" + b"\x12\x09uid-ghost" + b"\x1a\x05ghost"
req = b"\x0a" + bytes([len(claim)]) + claim
dra_api = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
for form in ("path", "default"):
    print(form, "GetInfo", call(form, reg, "/pluginregistration.Registration/GetInfo", b"").hex())
    if dra != "-":
        print(form, "Prepare", call(form, dra, dra_api + "NodePrepareResources", req).hex())
        print(form, "Unprepare", call(form, dra, dra_api + "NodeUnprepareResources", req).hex())
"#;

/// Runs [`CLIENT`] with Debian's interpreter, which python3-grpcio installs into (not
/// whatever python3 is first on PATH): whether it succeeded, stdout, stderr.
fn grpcio(reg: &std::path::Path, dra: Option<&std::path::Path>) -> (bool, String, String) {
    let out = Command::new("/usr/bin/python3")
        .args(["-c", CLIENT])
        .arg(reg)
        .arg(dra.map_or("-".into(), |d| d.display().to_string()))
        .output()
        .expect("python3 (with python3-grpcio: scripts/install-deps.sh)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_served_directly_resets_grpcio_sending_the_socket_path() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("gpuslice.io-reg.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let service = RegistrationService::new("/dra.sock".into(), Arc::new(Notify::new()));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || grpcio(&socket, None))
        .await
        .unwrap();
    assert!(
        !ok,
        "served directly, the path-authority call was answered: {stdout}"
    );
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("GetInfo (path authority)")
            && stderr.contains("Received RST_STREAM with error code 1"),
        "{stderr}"
    );
}

#[test]
fn python_grpcio_is_served_on_both_sockets_whatever_authority_it_sends() {
    let api = FakeApi::start();
    let tmp = tempfile::tempdir().unwrap();
    let n = Node::new("node-a", &[16], api.kubeconfig(tmp.path()));
    let p = n.start();
    let (ok, stdout, stderr) = grpcio(&p.reg, Some(&p.dra));
    assert!(ok, "{stdout}\n{stderr}");
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let line = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {stdout}"))
            .trim()
            .to_string()
    };
    // GetInfo names the driver; prepare of an unknown claim answers under its UID (an error
    // naming the claim), unprepare of it succeeds — in both authority forms.
    for form in ["path", "default"] {
        assert!(
            line(&format!("{form} GetInfo ")).contains(&hex("gpuslice.io")),
            "{stdout}"
        );
        let prepare = line(&format!("{form} Prepare "));
        assert!(prepare.contains(&hex("uid-ghost")), "{stdout}");
        assert!(prepare.contains(&hex("does not exist")), "{stdout}");
        assert!(
            line(&format!("{form} Unprepare ")).contains(&hex("uid-ghost")),
            "{stdout}"
        );
    }
    p.stop().unwrap();
}
