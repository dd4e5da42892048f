//! Makes the kubelet's plugin-registration calls acceptable to tonic.
//!
//! The kubelet dials a plugin's registration socket with its path as the gRPC target and no
//! authority of its own, so grpc-go sends the percent-encoded path as the HTTP/2 `:authority`
//! (`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F…-reg.sock`). That is not an authority (RFC 3986
//! allows `%` only in an IPv6 zone), and the h2 crate under tonic answers every such request with
//! RST_STREAM(PROTOCOL_ERROR): the kubelet then never registers the plugin. (The kubelet's CSI
//! client sets `localhost` itself; only the registration dial lacks it.)
//!
//! [`relay`] stands between the socket and the server: it forwards the client's HTTP/2 frames,
//! re-encoding each header block with `:authority: localhost`, and the server's frames unchanged.
use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may set: re-encoded blocks are cut to fit it.
const MAX_FRAME: usize = 16_384;
/// A header block larger than this is not a registration call: the connection is dropped.
const MAX_BLOCK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("reading or writing: {0}")]
    Io(#[from] std::io::Error),
    #[error("the client did not start with the HTTP/2 preface")]
    Preface,
    #[error("a malformed HTTP/2 frame: {0}")]
    Frame(&'static str),
    #[error("a header block HPACK cannot decode: {0:?}")]
    Hpack(loona_hpack::decoder::DecoderError),
}

/// Forwards `client` to `server` and back until the connection ends.
pub async fn relay<C, S>(client: C, server: S) -> Result<(), RelayError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut server_read, mut server_write) = tokio::io::split(server);
    let upstream = async {
        let result = rewrite(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
        result
    };
    let downstream = async {
        tokio::io::copy(&mut server_read, &mut client_write).await?;
        client_write.shutdown().await?;
        Ok::<_, RelayError>(())
    };
    tokio::pin!(upstream, downstream);
    // The client closing its side lets the server's last answers through; anything else (the
    // server closing, or a client the relay cannot follow) ends the connection.
    let ended = tokio::select! {
        up = &mut upstream => match up {
            Ok(()) => downstream.await,
            Err(e) => Err(e),
        },
        down = &mut downstream => down,
    };
    match ended {
        // The kubelet hangs up once it has its answer.
        Err(RelayError::Io(e))
            if matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// Copies the client's side of the connection, header blocks re-encoded.
async fn rewrite<R, W>(from: &mut R, to: &mut W) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; PREFACE.len()];
    from.read_exact(&mut preface).await?;
    if preface != PREFACE {
        return Err(RelayError::Preface);
    }
    to.write_all(&preface).await?;
    // One decoder for the client's block sequence, one encoder for the server's: HPACK's dynamic
    // tables live as long as the connection.
    let mut decoder = Decoder::new();
    let mut encoder = Encoder::new();
    // A block in progress: its stream, the END_STREAM flag of its HEADERS frame, and its bytes.
    let mut pending: Option<(u32, u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let length = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if length > MAX_BLOCK {
            return Err(RelayError::Frame("a frame larger than any registration call"));
        }
        let mut payload = vec![0u8; length];
        from.read_exact(&mut payload).await?;
        match (kind, pending.as_mut()) {
            (HEADERS, None) => {
                let fragment = header_fragment(&payload, flags)?;
                pending = Some((stream, flags & END_STREAM, fragment.to_vec()));
            }
            (CONTINUATION, Some((open, _, block))) if *open == stream => {
                if block.len() + payload.len() > MAX_BLOCK {
                    return Err(RelayError::Frame("a header block larger than any registration call"));
                }
                block.extend_from_slice(&payload);
            }
            (HEADERS | CONTINUATION, _) | (_, Some(_)) => {
                return Err(RelayError::Frame("a header block interrupted or continued out of turn"));
            }
            _ => {
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
                continue;
            }
        }
        if flags & END_HEADERS != 0
            && let Some((stream, end_stream, block)) = pending.take()
        {
            let headers = decoder.decode(&block).map_err(RelayError::Hpack)?;
            let block = encoder.encode(with_local_authority(&headers));
            to.write_all(&frames(stream, end_stream, &block)).await?;
        }
        to.flush().await?;
    }
}

/// The header block fragment of a HEADERS frame, without padding and priority fields.
fn header_fragment(payload: &[u8], flags: u8) -> Result<&[u8], RelayError> {
    let mut rest = payload;
    let mut padding = 0;
    if flags & PADDED != 0 {
        let (&length, after) = rest.split_first().ok_or(RelayError::Frame("PADDED with no pad length"))?;
        padding = usize::from(length);
        rest = after;
    }
    if flags & PRIORITY != 0 {
        rest = rest.get(5..).ok_or(RelayError::Frame("PRIORITY with no priority fields"))?;
    }
    rest.get(..rest.len().saturating_sub(padding))
        .filter(|_| padding <= rest.len())
        .ok_or(RelayError::Frame("more padding than payload"))
}

/// The headers, `:authority` replaced by `localhost` (the value grpc-go sends on Unix sockets
/// when its target is a `unix:` URI).
fn with_local_authority(headers: &[(Vec<u8>, Vec<u8>)]) -> impl Iterator<Item = (&[u8], &[u8])> {
    headers.iter().map(|(name, value)| {
        if name.as_slice() == b":authority" {
            (name.as_slice(), b"localhost".as_slice())
        } else {
            (name.as_slice(), value.as_slice())
        }
    })
}

/// A HEADERS frame, and CONTINUATION frames if the block needs them, carrying `block`.
fn frames(stream: u32, end_stream: u8, block: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(block.len() + 9);
    let chunks: Vec<&[u8]> = if block.is_empty() { vec![block] } else { block.chunks(MAX_FRAME).collect() };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let mut flags = if i == last { END_HEADERS } else { 0 };
        if i == 0 {
            flags |= end_stream;
        }
        // A chunk is at most MAX_FRAME (2^14) bytes: it fits the 24-bit length.
        let length = chunk.len().to_be_bytes();
        out.extend_from_slice(&length[length.len() - 3..]);
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let length = payload.len().to_be_bytes();
        let mut out = length[length.len() - 3..].to_vec();
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    async fn through_relay(input: Vec<u8>) -> Vec<u8> {
        let (mut client, relay_client) = tokio::io::duplex(1 << 20);
        let (relay_server, mut server) = tokio::io::duplex(1 << 20);
        let task = tokio::spawn(relay(relay_client, relay_server));
        client.write_all(&input).await.unwrap();
        client.shutdown().await.unwrap();
        let mut out = Vec::new();
        server.read_to_end(&mut out).await.unwrap();
        drop(server);
        drop(client);
        let _ = task.await;
        out
    }

    /// Splits `bytes` after the preface into (kind, flags, stream, payload).
    fn parse(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut rest = &bytes[PREFACE.len()..];
        let mut frames = Vec::new();
        while !rest.is_empty() {
            let length = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            frames.push((rest[3], rest[4], stream, rest[9..9 + length].to_vec()));
            rest = &rest[9 + length..];
        }
        frames
    }

    #[tokio::test]
    async fn the_kubelets_path_authority_becomes_localhost_and_other_frames_pass_unchanged() {
        let mut encoder = Encoder::new();
        let request: [(&[u8], &[u8]); 4] = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock"),
        ];
        let block = encoder.encode(request);
        let (first, second) = block.split_at(block.len() / 2);
        let mut padded = vec![3u8];
        padded.extend_from_slice(first);
        padded.extend_from_slice(&[0, 0, 0]);
        let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let data = frame(0x0, END_STREAM, 1, b"\0\0\0\0\0");
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&settings);
        input.extend_from_slice(&frame(HEADERS, PADDED, 1, &padded));
        input.extend_from_slice(&frame(CONTINUATION, END_HEADERS, 1, second));
        input.extend_from_slice(&data);

        let out = through_relay(input).await;
        assert!(out.starts_with(PREFACE));
        let frames = parse(&out);
        assert_eq!(frames.len(), 3, "{frames:?}");
        assert_eq!(frame(frames[0].0, frames[0].1, frames[0].2, &frames[0].3), settings);
        let (kind, flags, stream, block) = &frames[1];
        assert_eq!((*kind, *flags, *stream), (HEADERS, END_HEADERS, 1));
        let headers = Decoder::new().decode(block).unwrap();
        let authority = headers.iter().find(|(n, _)| n == b":authority").map(|(_, v)| v.as_slice());
        assert_eq!(authority, Some(b"localhost".as_slice()));
        let path = headers.iter().find(|(n, _)| n == b":path").map(|(_, v)| v.as_slice());
        assert_eq!(path, Some(b"/pluginregistration.Registration/GetInfo".as_slice()));
        assert_eq!(frame(frames[2].0, frames[2].1, frames[2].2, &frames[2].3), data);
    }

    #[tokio::test]
    async fn a_client_without_the_preface_or_with_a_broken_block_is_cut_off() {
        let (mut client, relay_client) = tokio::io::duplex(1 << 16);
        let (relay_server, _server) = tokio::io::duplex(1 << 16);
        let task = tokio::spawn(relay(relay_client, relay_server));
        client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        assert!(matches!(task.await.unwrap(), Err(RelayError::Preface)));

        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff]));
        let (mut client, relay_client) = tokio::io::duplex(1 << 16);
        let (relay_server, _server) = tokio::io::duplex(1 << 16);
        let task = tokio::spawn(relay(relay_client, relay_server));
        client.write_all(&input).await.unwrap();
        assert!(matches!(task.await.unwrap(), Err(RelayError::Hpack(_))));
    }

    #[test]
    fn padding_and_priority_are_taken_off_and_lies_about_them_refused() {
        assert_eq!(header_fragment(&[2, 7, 8, 0, 0], PADDED).unwrap(), &[7, 8]);
        assert_eq!(header_fragment(&[0, 0, 0, 1, 16, 9], PRIORITY).unwrap(), &[9]);
        assert!(header_fragment(&[9, 1], PADDED).is_err());
        assert!(header_fragment(&[0, 0], PRIORITY).is_err());
    }
}
