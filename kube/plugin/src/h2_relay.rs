//! An HTTP/2 relay in front of the plugin's registration socket, so that a real kubelet can
//! register the plugin at all. The kubelet's plugin-registration client
//! (`pkg/kubelet/pluginmanager`, `grpc.DialContext` with the bare socket path, Kubernetes 1.37
//! included) sends that path as the HTTP/2 `:authority`. h2, under tonic, refuses such a
//! request with `PROTOCOL_ERROR` (hyperium/h2#487), so a real kubelet could never register the
//! plugin. Each connection to the registration socket therefore passes through [`relay`]: it
//! reads the client's HTTP/2 frames, replaces an `:authority` that is not a valid authority
//! with `localhost` in each header block, and forwards every other frame byte for byte; the
//! server's answers go back untouched. The DRA socket's connections pass through it too: the
//! kubelet's DRA client dials `unix:` targets (authority `localhost`), but other standard gRPC
//! clients (Python's grpcio sends the socket path) must be answered as well.

use std::borrow::Cow;

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::{Stream, StreamExt};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// SETTINGS_MAX_FRAME_SIZE's initial value, which tonic's server keeps: the frames written
/// here stay within it.
const MAX_FRAME: usize = 16_384;
/// The largest header block accepted (the kubelet's requests are a few hundred bytes; h2's
/// own limit on a decoded header list is 16 KiB by default).
const MAX_BLOCK: usize = 64 * 1024;
/// What replaces an invalid `:authority`.
const LOCALHOST: &[u8] = b"localhost";
/// The in-process pipe between the relay and the gRPC server.
const PIPE: usize = 64 * 1024;

/// Why a connection to a plugin socket was dropped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("plugin socket connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("plugin socket connection: the client did not open with the HTTP/2 preface")]
    Preface,
    #[error("plugin socket connection: the connection ended inside a frame")]
    Truncated,
    #[error(
        "plugin socket connection: the header block of stream {stream} cannot be decoded: {detail}"
    )]
    Hpack { stream: u32, detail: String },
    #[error("plugin socket connection: a frame of type {kind:#x} on stream {found} inside the header block of stream {stream} (only CONTINUATION of that stream may follow)")]
    Interleaved { stream: u32, kind: u8, found: u32 },
    #[error(
        "plugin socket connection: the header block of stream {stream} exceeds {MAX_BLOCK} bytes"
    )]
    TooLarge { stream: u32 },
    #[error("plugin socket connection: the HEADERS frame of stream {stream} is shorter than its padding and priority fields")]
    Malformed { stream: u32 },
}

/// The registration socket's connections, each through [`relay`]: what the gRPC server
/// serves.
pub fn relayed_incoming(
    listener: UnixListener,
) -> impl Stream<Item = std::io::Result<DuplexStream>> {
    UnixListenerStream::new(listener).map(|accepted| accepted.map(relay))
}

/// Relays one accepted registration connection; the returned end is what the gRPC server
/// serves. An error in the client's frames ends the connection both ways at once (the client
/// reads its end, the server its pipe's; the kubelet retries) and is logged; a client that
/// ends cleanly is answered until the server closes; a server that closes ends the relay.
pub fn relay(client: UnixStream) -> DuplexStream {
    let (ours, theirs) = tokio::io::duplex(PIPE);
    tokio::spawn(async move {
        let (client_read, mut client_write) = client.into_split();
        let (mut server_read, server_write) = tokio::io::split(ours);
        let up = rewrite_client_frames(client_read, server_write);
        let down = async move {
            let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            let _ = client_write.shutdown().await;
        };
        tokio::pin!(down);
        tokio::select! {
            up = up => match up {
                Ok(()) => (&mut down).await,
                // Dropping `down` closes the client's socket and, the pipe's two halves gone,
                // the server's end: neither side is left holding a connection open.
                Err(e) => eprintln!("gpuslice kubelet-plugin: {e}"),
            },
            () = &mut down => {}
        }
    });
    theirs
}

/// One frame's 9-byte header.
#[derive(Debug, Clone, Copy)]
struct FrameHeader {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameHeader {
    fn parse(b: &[u8; FRAME_HEADER]) -> FrameHeader {
        FrameHeader {
            len: usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5] & 0x7f, b[6], b[7], b[8]]),
        }
    }
}

/// Reads a frame header; `None` at a clean end of the connection.
async fn read_header<R: AsyncRead + Unpin>(
    from: &mut R,
) -> Result<Option<([u8; FRAME_HEADER], FrameHeader)>, RelayError> {
    let mut raw = [0u8; FRAME_HEADER];
    let mut got = 0;
    while got < FRAME_HEADER {
        let n = from.read(&mut raw[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(RelayError::Truncated)
            };
        }
        got += n;
    }
    Ok(Some((raw, FrameHeader::parse(&raw))))
}

async fn read_payload<R: AsyncRead + Unpin>(
    from: &mut R,
    len: usize,
) -> Result<Vec<u8>, RelayError> {
    let mut payload = vec![0u8; len];
    from.read_exact(&mut payload)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => RelayError::Truncated,
            _ => RelayError::Io(e),
        })?;
    Ok(payload)
}

/// The header-block fragment of a HEADERS payload and its priority fields, padding removed.
fn headers_fragment(
    h: &FrameHeader,
    payload: &[u8],
) -> Result<(Option<[u8; 5]>, Vec<u8>), RelayError> {
    let malformed = || RelayError::Malformed { stream: h.stream };
    let mut body = payload;
    let mut pad = 0usize;
    if h.flags & PADDED != 0 {
        let (&n, rest) = body.split_first().ok_or_else(malformed)?;
        pad = usize::from(n);
        body = rest;
    }
    let mut priority = None;
    if h.flags & PRIORITY != 0 {
        let (fields, rest) = body.split_first_chunk::<5>().ok_or_else(malformed)?;
        priority = Some(*fields);
        body = rest;
    }
    let end = body.len().checked_sub(pad).ok_or_else(malformed)?;
    Ok((priority, body[..end].to_vec()))
}

/// Whether `value` is an authority h2 accepts.
fn valid_authority(value: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(value).is_ok()
}

/// The connection's two HPACK contexts: the client's (decoded) and ours towards the server.
struct BlockRewriter {
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
}

impl BlockRewriter {
    fn new() -> BlockRewriter {
        BlockRewriter {
            decoder: Decoder::new(),
            encoder: Encoder::new(),
        }
    }

    fn rewrite(&mut self, stream: u32, block: &[u8]) -> Result<Vec<u8>, RelayError> {
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        self.decoder
            .decode_with_cb(block, |name: Cow<[u8]>, value: Cow<[u8]>| {
                fields.push((name.into_owned(), value.into_owned()));
            })
            .map_err(|e| RelayError::Hpack {
                stream,
                detail: e.to_string(),
            })?;
        for (name, value) in &mut fields {
            if name.as_slice() == b":authority" && !valid_authority(value) {
                *value = LOCALHOST.to_vec();
            }
        }
        Ok(self
            .encoder
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))))
    }
}

fn frame_header(len: usize, kind: u8, flags: u8, stream: u32) -> [u8; FRAME_HEADER] {
    // `len` ≤ MAX_FRAME < 2^24 by construction.
    let l = (len as u32).to_be_bytes();
    let s = stream.to_be_bytes();
    [l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]
}

/// Writes a header block as one HEADERS frame and as many CONTINUATION frames as
/// `MAX_FRAME` needs.
async fn write_headers<W: AsyncWrite + Unpin>(
    to: &mut W,
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    block: &[u8],
) -> Result<(), RelayError> {
    let mut first = Vec::with_capacity(MAX_FRAME);
    let mut flags = if end_stream { END_STREAM } else { 0 };
    if let Some(p) = priority {
        flags |= PRIORITY;
        first.extend_from_slice(&p);
    }
    let take = block.len().min(MAX_FRAME - first.len());
    first.extend_from_slice(&block[..take]);
    let mut rest = &block[take..];
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    to.write_all(&frame_header(first.len(), HEADERS, flags, stream))
        .await?;
    to.write_all(&first).await?;
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        let flags = if tail.is_empty() { END_HEADERS } else { 0 };
        to.write_all(&frame_header(chunk.len(), CONTINUATION, flags, stream))
            .await?;
        to.write_all(chunk).await?;
        rest = tail;
    }
    Ok(())
}

/// Copies the client's side of the connection to the server, rewriting header blocks.
async fn rewrite_client_frames<R, W>(mut from: R, mut to: W) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; PREFACE.len()];
    match from.read_exact(&mut preface).await {
        Ok(_) if &preface == PREFACE => {}
        Ok(_) => return Err(RelayError::Preface),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(RelayError::Preface),
        Err(e) => return Err(RelayError::Io(e)),
    }
    to.write_all(PREFACE).await?;
    let mut rewriter = BlockRewriter::new();
    while let Some((raw, h)) = read_header(&mut from).await? {
        if h.kind != HEADERS {
            // Everything else goes through as it came, without being held in memory.
            to.write_all(&raw).await?;
            let copied = tokio::io::copy(&mut (&mut from).take(h.len as u64), &mut to).await?;
            if copied != h.len as u64 {
                return Err(RelayError::Truncated);
            }
            to.flush().await?;
            continue;
        }
        if h.len > MAX_BLOCK {
            return Err(RelayError::TooLarge { stream: h.stream });
        }
        let payload = read_payload(&mut from, h.len).await?;
        let (priority, mut block) = headers_fragment(&h, &payload)?;
        let mut flags = h.flags;
        while flags & END_HEADERS == 0 {
            let (_, next) = read_header(&mut from).await?.ok_or(RelayError::Truncated)?;
            if next.kind != CONTINUATION || next.stream != h.stream {
                return Err(RelayError::Interleaved {
                    stream: h.stream,
                    kind: next.kind,
                    found: next.stream,
                });
            }
            if block.len() + next.len > MAX_BLOCK {
                return Err(RelayError::TooLarge { stream: h.stream });
            }
            block.extend_from_slice(&read_payload(&mut from, next.len).await?);
            flags |= next.flags & END_HEADERS;
        }
        let block = rewriter.rewrite(h.stream, &block)?;
        write_headers(
            &mut to,
            h.stream,
            h.flags & END_STREAM != 0,
            priority,
            &block,
        )
        .await?;
        to.flush().await?;
    }
    to.shutdown().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOCKET_PATH: &[u8] = b"/var/lib/kubelet/plugins_registry/gpuslice.io-reg.sock";

    fn request_headers(authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"user-agent", b"grpc-go/1.72.0"),
        ]
        .iter()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect()
    }

    fn encode(encoder: &mut Encoder<'static>, fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        encoder.encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
    }

    /// Parses a byte stream of frames (after the preface).
    fn frames(mut bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let raw: [u8; FRAME_HEADER] = bytes[..FRAME_HEADER].try_into().unwrap();
            let h = FrameHeader::parse(&raw);
            out.push((h, bytes[FRAME_HEADER..FRAME_HEADER + h.len].to_vec()));
            bytes = &bytes[FRAME_HEADER + h.len..];
        }
        out
    }

    fn decode(decoder: &mut Decoder<'static>, block: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut fields = Vec::new();
        decoder
            .decode_with_cb(block, |n: Cow<[u8]>, v: Cow<[u8]>| {
                fields.push((n.into_owned(), v.into_owned()))
            })
            .unwrap();
        fields
    }

    async fn run(input: Vec<u8>) -> Result<Vec<u8>, RelayError> {
        let mut out = Vec::new();
        rewrite_client_frames(&input[..], &mut out).await?;
        Ok(out)
    }

    #[tokio::test]
    async fn the_socket_path_authority_becomes_localhost_and_the_rest_is_kept() {
        let mut enc = Encoder::new();
        // Two requests on one connection: the second leans on the first's dynamic table.
        let first = encode(&mut enc, &request_headers(SOCKET_PATH));
        let second = encode(&mut enc, &request_headers(SOCKET_PATH));
        let data = [0u8, 0, 0, 0, 0];
        let mut input = PREFACE.to_vec();
        input.extend(frame_header(0, 0x4, 0, 0)); // SETTINGS
        input.extend(frame_header(first.len(), HEADERS, END_HEADERS, 1));
        input.extend(&first);
        input.extend(frame_header(data.len(), 0x0, END_STREAM, 1)); // DATA
        input.extend(data);
        input.extend(frame_header(second.len(), HEADERS, END_HEADERS, 3));
        input.extend(&second);

        let out = run(input).await.unwrap();
        assert_eq!(&out[..24], PREFACE);
        let got = frames(&out[24..]);
        let kinds: Vec<(u8, u8, u32)> = got
            .iter()
            .map(|(h, _)| (h.kind, h.flags, h.stream))
            .collect();
        assert_eq!(
            kinds,
            [
                (0x4, 0, 0),
                (HEADERS, END_HEADERS, 1),
                (0x0, END_STREAM, 1),
                (HEADERS, END_HEADERS, 3)
            ]
        );
        assert_eq!(got[2].1, data, "DATA passes byte for byte");
        let mut dec = Decoder::new();
        for i in [1, 3] {
            let fields = decode(&mut dec, &got[i].1);
            assert_eq!(fields, request_headers(LOCALHOST), "frame {i}");
        }
    }

    #[tokio::test]
    async fn a_valid_authority_is_left_as_it_is() {
        let mut enc = Encoder::new();
        let block = encode(&mut enc, &request_headers(b"localhost:1234"));
        let mut input = PREFACE.to_vec();
        input.extend(frame_header(
            block.len(),
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
        ));
        input.extend(&block);
        let out = run(input).await.unwrap();
        let got = frames(&out[24..]);
        assert_eq!(got[0].0.flags, END_HEADERS | END_STREAM);
        let fields = decode(&mut Decoder::new(), &got[0].1);
        assert_eq!(fields, request_headers(b"localhost:1234"));
    }

    #[tokio::test]
    async fn padding_priority_and_continuation_are_reassembled() {
        let mut enc = Encoder::new();
        let block = encode(&mut enc, &request_headers(SOCKET_PATH));
        let (a, b) = block.split_at(10);
        let priority = [0x80, 0, 0, 0, 15];
        let mut payload = vec![3u8]; // pad length
        payload.extend(priority);
        payload.extend(a);
        payload.extend([0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame_header(payload.len(), HEADERS, PADDED | PRIORITY, 5));
        input.extend(&payload);
        input.extend(frame_header(b.len(), CONTINUATION, END_HEADERS, 5));
        input.extend(b);
        let out = run(input).await.unwrap();
        let got = frames(&out[24..]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.flags, PRIORITY | END_HEADERS);
        assert_eq!(got[0].1[..5], priority);
        let fields = decode(&mut Decoder::new(), &got[0].1[5..]);
        assert_eq!(fields, request_headers(LOCALHOST));
    }

    #[tokio::test]
    async fn a_large_block_is_split_into_continuation_frames() {
        let mut fields = request_headers(SOCKET_PATH);
        fields.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        let block = encode(&mut Encoder::new(), &fields);
        let mut input = PREFACE.to_vec();
        input.extend(frame_header(MAX_FRAME, HEADERS, 0, 1));
        input.extend(&block[..MAX_FRAME]);
        input.extend(frame_header(
            block.len() - MAX_FRAME,
            CONTINUATION,
            END_HEADERS,
            1,
        ));
        input.extend(&block[MAX_FRAME..]);
        let out = run(input).await.unwrap();
        let got = frames(&out[24..]);
        assert!(got.len() >= 3, "{} frames", got.len());
        assert!(got.iter().all(|(h, _)| h.len <= MAX_FRAME));
        assert_eq!(got[0].0.kind, HEADERS);
        assert!(got[1..].iter().all(|(h, _)| h.kind == CONTINUATION));
        assert!(got.last().unwrap().0.flags & END_HEADERS != 0);
        let joined: Vec<u8> = got.iter().flat_map(|(_, p)| p.clone()).collect();
        fields[3].1 = LOCALHOST.to_vec();
        assert_eq!(decode(&mut Decoder::new(), &joined), fields);
    }

    /// Reads `from` to its end (a reset, as a socket closed with input unread gives, ends it
    /// too), failing the test if it does not end within a minute (the guard of a test that
    /// would otherwise hang, not a speed goal).
    async fn read_to_end<R: AsyncRead + Unpin>(mut from: R, what: &str) -> Vec<u8> {
        let mut got = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            from.read_to_end(&mut got),
        )
        .await
        .unwrap_or_else(|_| panic!("{what} was left open"));
        if let Err(e) = read {
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{what}: {e}");
        }
        got
    }

    #[tokio::test]
    async fn a_refused_client_is_disconnected_and_the_server_told() {
        for input in [
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            [
                &PREFACE[..],
                &frame_header(1, HEADERS, END_HEADERS, 1),
                &[0xff],
            ]
            .concat(),
        ] {
            let (mut client, accepted) = UnixStream::pair().unwrap();
            // The server never answers and never closes, as a busy or idle gRPC server.
            let server = relay(accepted);
            client.write_all(&input).await.unwrap();
            let answered = read_to_end(&mut client, "the client's connection").await;
            assert!(answered.is_empty(), "{answered:?}");
            let forwarded = read_to_end(server, "the server's pipe").await;
            assert!(forwarded.len() <= PREFACE.len(), "{forwarded:?}");
        }
    }

    #[tokio::test]
    async fn a_client_that_ends_cleanly_is_still_answered() {
        let (mut client, accepted) = UnixStream::pair().unwrap();
        let mut server = relay(accepted);
        client.write_all(PREFACE).await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, PREFACE);
        server.write_all(b"answer").await.unwrap();
        server.shutdown().await.unwrap();
        drop(server);
        assert_eq!(
            read_to_end(&mut client, "the client's connection").await,
            b"answer"
        );
    }

    #[tokio::test]
    async fn broken_input_is_refused_with_what_was_wrong() {
        let err = run(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec())
            .await
            .unwrap_err();
        assert!(matches!(err, RelayError::Preface), "{err}");

        let mut input = PREFACE.to_vec();
        input.extend(frame_header(4, HEADERS, 0, 1));
        input.extend([0x82, 0x86, 0x84, 0x41]);
        input.extend(frame_header(0, 0x0, 0, 1)); // DATA where CONTINUATION must be
        let err = run(input).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("type 0x0 on stream 1 inside the header block of stream 1"),
            "{err}"
        );

        let mut input = PREFACE.to_vec();
        input.extend(frame_header(1, HEADERS, END_HEADERS, 1));
        input.extend([0xff]); // an index with its continuation byte missing
        let err = run(input).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("header block of stream 1 cannot be decoded"),
            "{err}"
        );

        let mut input = PREFACE.to_vec();
        input.extend(frame_header(2, HEADERS, END_HEADERS | PADDED, 1));
        input.extend([9, 0]); // 9 bytes of padding in a 2-byte payload
        let err = run(input).await.unwrap_err();
        assert!(matches!(err, RelayError::Malformed { stream: 1 }), "{err}");

        let mut input = PREFACE.to_vec();
        input.extend(frame_header(100, 0x0, 0, 1));
        input.extend([0; 10]);
        let err = run(input).await.unwrap_err();
        assert!(matches!(err, RelayError::Truncated), "{err}");

        let mut input = PREFACE.to_vec();
        input.extend(frame_header(MAX_FRAME, HEADERS, 0, 1));
        input.extend(vec![0x82; MAX_FRAME]);
        for _ in 0..4 {
            input.extend(frame_header(MAX_FRAME, CONTINUATION, 0, 1));
            input.extend(vec![0x82; MAX_FRAME]);
        }
        let err = run(input).await.unwrap_err();
        assert!(matches!(err, RelayError::TooLarge { stream: 1 }), "{err}");
    }
}
