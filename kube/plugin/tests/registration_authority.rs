//! The registration socket answers the kubelet's registration client, which sends the socket
//! path as HTTP/2 `:authority` (Kubernetes 1.37's `pkg/kubelet/pluginmanager`): the bytes of
//! such a GetInfo call, written as that client writes them, against the real tonic
//! registration server — refused by h2 when served directly (what the plugin did before),
//! answered when served through `h2_relay::relayed_incoming` (what `serve::run` does).

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpuslice_kube::h2_relay::relayed_incoming;
use gpuslice_kube::proto::registration::registration_server::RegistrationServer;
use gpuslice_kube::proto::registration::PluginInfo;
use gpuslice_kube::registration::RegistrationService;
use loona_hpack::{Decoder, Encoder};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;
use tokio_stream::wrappers::UnixListenerStream;

const ENDPOINT: &str = "/var/lib/kubelet/plugins/gpuslice.io/dra.sock";

fn server(relayed: bool, socket: &Path) {
    let listener = UnixListener::bind(socket).unwrap();
    let service = RegistrationService::new(ENDPOINT.to_string(), Arc::new(Notify::new()));
    let router = tonic::transport::Server::builder().add_service(RegistrationServer::new(service));
    if relayed {
        tokio::spawn(router.serve_with_incoming(relayed_incoming(listener)));
    } else {
        tokio::spawn(router.serve_with_incoming(UnixListenerStream::new(listener)));
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

/// What the server answered stream 1.
#[derive(Debug)]
enum Answer {
    Reset(u32),
    Done {
        headers: Vec<(String, String)>,
        data: Vec<u8>,
    },
}

async fn get_info(socket: &Path, authority: &str) -> Answer {
    let mut conn = UnixStream::connect(socket).await.unwrap();
    let block = Encoder::new().encode([
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/pluginregistration.Registration/GetInfo"),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"user-agent", b"grpc-go/1.72.0"),
    ]);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    out.extend(frame(0x1, 0x4, 1, &block)); // HEADERS, END_HEADERS
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0])); // DATA: an empty InfoRequest, END_STREAM
    conn.write_all(&out).await.unwrap();

    let mut decoder = Decoder::new();
    let mut headers = Vec::new();
    let mut data = Vec::new();
    loop {
        let mut head = [0u8; 9];
        conn.read_exact(&mut head).await.unwrap();
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]]);
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).await.unwrap();
        match (kind, stream) {
            (0x4, 0) if flags & 0x1 == 0 => {
                conn.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap(); // SETTINGS ACK
            }
            (0x3, 1) => return Answer::Reset(u32::from_be_bytes(payload[..4].try_into().unwrap())),
            (0x0, 1) => data.extend(payload),
            (0x1, 1) => {
                decoder
                    .decode_with_cb(&payload, |n: Cow<[u8]>, v: Cow<[u8]>| {
                        headers.push((
                            String::from_utf8_lossy(&n).into_owned(),
                            String::from_utf8_lossy(&v).into_owned(),
                        ))
                    })
                    .unwrap();
                if flags & 0x1 != 0 {
                    return Answer::Done { headers, data };
                }
            }
            _ => {}
        }
    }
}

async fn ask(relayed: bool, authority: &str) -> Answer {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("gpuslice.io-reg.sock");
    server(relayed, &socket);
    tokio::time::timeout(Duration::from_secs(20), get_info(&socket, authority))
        .await
        .expect("the server answered within 20 s")
}

fn plugin_info(answer: Answer) -> PluginInfo {
    let Answer::Done { headers, data } = answer else {
        panic!("expected an answer, got {answer:?}");
    };
    assert!(
        headers.contains(&("grpc-status".into(), "0".into())),
        "{headers:?}"
    );
    assert_eq!(data[0], 0, "an uncompressed gRPC message");
    let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
    PluginInfo::decode(&data[5..5 + len]).unwrap()
}

const KUBELET_AUTHORITY: &str = "/var/lib/kubelet/plugins_registry/gpuslice.io-reg.sock";

#[tokio::test]
async fn served_directly_h2_refuses_the_kubelets_authority() {
    // What the plugin did before: PROTOCOL_ERROR, and the kubelet never registers it.
    let answer = ask(false, KUBELET_AUTHORITY).await;
    assert!(matches!(answer, Answer::Reset(1)), "{answer:?}");
}

#[tokio::test]
async fn through_the_relay_the_kubelets_get_info_is_answered() {
    let info = plugin_info(ask(true, KUBELET_AUTHORITY).await);
    assert_eq!(info.name, "gpuslice.io");
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.endpoint, ENDPOINT);
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
}

#[tokio::test]
async fn through_the_relay_a_well_formed_client_is_answered_as_before() {
    let direct = plugin_info(ask(false, "localhost").await);
    let relayed = plugin_info(ask(true, "localhost").await);
    assert_eq!(direct, relayed);
}
