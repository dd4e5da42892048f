//! The TLS key exchange groups that servers on loopback choose, read off the wire: a packet
//! capture of `lo` (an `AF_PACKET` socket, so it needs `CAP_NET_RAW`) whose thread parses every
//! ServerHello it sees. It shows what two builds really negotiate, whichever side is ours, so it
//! is run where the loopback interface is the suite's own: `make test-interop` starts the suite in
//! a network namespace of its own.
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A TLS 1.3 ServerHello with this random is a HelloRetryRequest (TLS 1.3 fixes the value): it names
/// the group the server wants a share of, and the real ServerHello follows.
const HELLO_RETRY_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91, 0xc2, 0xa2, 0x11,
    0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];
const EXT_SUPPORTED_VERSIONS: u16 = 43;
const EXT_KEY_SHARE: u16 = 51;

/// What one ServerHello said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHello {
    /// The TCP port the server answered from.
    pub server_port: u16,
    /// TLS 1.3 (the supported_versions extension names it); otherwise TLS 1.2, whose group is in
    /// a later, unparsed message.
    pub tls13: bool,
    /// The key_share extension's group (TLS 1.3), by IANA code point.
    pub group: Option<u16>,
    pub hello_retry: bool,
}

/// The IANA name of a key exchange group.
pub fn group_name(code: u16) -> String {
    match code {
        0x0017 => "secp256r1".into(),
        0x0018 => "secp384r1".into(),
        0x0019 => "secp521r1".into(),
        0x001d => "X25519".into(),
        0x11eb => "SecP256r1MLKEM768".into(),
        0x11ec => "X25519MLKEM768".into(),
        0x11ed => "SecP384r1MLKEM1024".into(),
        other => format!("0x{other:04x}"),
    }
}

/// Parses one captured frame (an Ethernet header, as `lo` gives, then IPv4 or IPv6 and TCP) and
/// returns the ServerHello at the start of its TCP payload, if any. A TLS server's first flight
/// starts a segment, and loopback's MTU keeps a ServerHello in one.
pub fn server_hello_in_frame(frame: &[u8]) -> Option<ServerHello> {
    let ether_type = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let ip = frame.get(14..)?;
    let (protocol, tcp) = match ether_type {
        0x0800 => {
            let header = usize::from(ip.first()? & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
            (*ip.get(9)?, ip.get(header..total.min(ip.len()))?)
        }
        0x86dd => {
            let payload = usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]));
            (*ip.get(6)?, ip.get(40..(40 + payload).min(ip.len()))?)
        }
        _ => return None,
    };
    if protocol != 6 {
        return None;
    }
    let server_port = u16::from_be_bytes([*tcp.first()?, *tcp.get(1)?]);
    let data_offset = usize::from(tcp.get(12)? >> 4) * 4;
    let mut hello = parse_server_hello(tcp.get(data_offset..)?)?;
    hello.server_port = server_port;
    Some(hello)
}

/// A TLS handshake record holding a ServerHello, parsed (its port left 0).
fn parse_server_hello(record: &[u8]) -> Option<ServerHello> {
    // Record: type 22 (handshake), version, length; then the handshake: type 2, length (3 bytes).
    if *record.first()? != 22 || *record.get(5)? != 2 {
        return None;
    }
    let body = record.get(9..)?;
    let mut at = 2; // legacy_version
    let random = body.get(at..at + 32)?;
    at += 32;
    at += 1 + usize::from(*body.get(at)?); // legacy_session_id
    at += 2 + 1; // cipher_suite, legacy_compression_method
    let mut hello =
        ServerHello { server_port: 0, tls13: false, group: None, hello_retry: random == HELLO_RETRY_RANDOM };
    let Some(length) = body.get(at..at + 2) else {
        return Some(hello); // no extensions: TLS 1.2 at most
    };
    let end = (at + 2 + usize::from(u16::from_be_bytes([length[0], length[1]]))).min(body.len());
    at += 2;
    while at + 4 <= end {
        let kind = u16::from_be_bytes([body[at], body[at + 1]]);
        let len = usize::from(u16::from_be_bytes([body[at + 2], body[at + 3]]));
        let data = body.get(at + 4..at + 4 + len)?;
        match kind {
            EXT_SUPPORTED_VERSIONS => hello.tls13 = data == [0x03, 0x04],
            EXT_KEY_SHARE => hello.group = Some(u16::from_be_bytes([*data.first()?, *data.get(1)?])),
            _ => {}
        }
        at += 4 + len;
    }
    Some(hello)
}

/// A running capture of `lo`; `stop` ends it and gives every ServerHello seen, in order.
pub struct LoopbackCapture {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<ServerHello>>>,
    thread: Option<JoinHandle<()>>,
}

impl LoopbackCapture {
    pub fn start() -> std::io::Result<LoopbackCapture> {
        let socket = packet_socket()?;
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (thread_stop, thread_seen) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let mut frame = vec![0u8; 65_600];
            while !thread_stop.load(Ordering::Relaxed) {
                let Some(len) = receive_incoming(&socket, &mut frame) else { continue };
                if let Some(hello) = server_hello_in_frame(&frame[..len]) {
                    thread_seen.lock().unwrap_or_else(|e| e.into_inner()).push(hello);
                }
            }
        });
        Ok(LoopbackCapture { stop, seen, thread: Some(thread) })
    }

    pub fn stop(mut self) -> Vec<ServerHello> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for LoopbackCapture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Counts of each (server port, group) pair among `hellos`, HelloRetryRequests left out.
pub fn groups_by_port(hellos: &[ServerHello]) -> BTreeMap<u16, BTreeMap<String, usize>> {
    let mut by_port: BTreeMap<u16, BTreeMap<String, usize>> = BTreeMap::new();
    for hello in hellos.iter().filter(|h| !h.hello_retry) {
        let group = match (hello.tls13, hello.group) {
            (true, Some(code)) => group_name(code),
            (true, None) => "TLS 1.3 without a key share".into(),
            (false, _) => "TLS 1.2".into(),
        };
        *by_port.entry(hello.server_port).or_default().entry(group).or_default() += 1;
    }
    by_port
}

/// An `AF_PACKET` socket that receives every frame of every interface (in the suite's network
/// namespace, only `lo`), with a large buffer so a busy moment drops nothing, and a timeout so the
/// thread sees `stop`.
fn packet_socket() -> std::io::Result<OwnedFd> {
    let all = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: socket(2) with constant arguments; the descriptor it returns is owned below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(all)) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let buffer: libc::c_int = 32 << 20;
    let timeout = libc::timeval { tv_sec: 0, tv_usec: 200_000 };
    // SAFETY: setsockopt(2) reads exactly the size given of each value, which outlives the call.
    unsafe {
        let size = |n: usize| n as libc::socklen_t;
        let force = libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&raw const buffer).cast(),
            size(size_of_val(&buffer)),
        );
        if force != 0 {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&raw const buffer).cast(),
                size(size_of_val(&buffer)),
            );
        }
        if libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            size(size_of_val(&timeout)),
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(socket)
}

/// The next frame received (not the copy of one sent: on `lo` each packet shows up both ways), or
/// None on the timeout.
fn receive_incoming(socket: &OwnedFd, frame: &mut [u8]) -> Option<usize> {
    // SAFETY: sockaddr_ll is plain data, for which all zeroes is a valid value.
    let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut from_len = size_of_val(&from) as libc::socklen_t;
    // SAFETY: recvfrom(2) writes at most `frame.len()` bytes into `frame` and at most `from_len`
    // into `from`, both of which live across the call.
    let len = unsafe {
        libc::recvfrom(
            socket.as_raw_fd(),
            frame.as_mut_ptr().cast(),
            frame.len(),
            0,
            (&raw mut from).cast(),
            &mut from_len,
        )
    };
    let len = usize::try_from(len).ok()?;
    (from.sll_pkttype != libc::PACKET_OUTGOING).then_some(len.min(frame.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame as `lo` carries it: an Ethernet header of zeroes, IPv4, TCP from `port`, `payload`.
    fn frame(port: u16, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![0u8; 12];
        frame.extend([0x08, 0x00]);
        let total = u16::try_from(20 + 20 + payload.len()).unwrap();
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 6, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        frame.extend(ip);
        let mut tcp = vec![0u8; 20];
        tcp[0..2].copy_from_slice(&port.to_be_bytes());
        tcp[12] = 5 << 4;
        frame.extend(tcp);
        frame.extend(payload);
        frame
    }

    fn server_hello(random: [u8; 32], extensions: &[(u16, &[u8])]) -> Vec<u8> {
        let mut body = vec![0x03, 0x03];
        body.extend(random);
        body.extend([0]); // no session id
        body.extend([0x13, 0x01, 0]);
        let mut ext = Vec::new();
        for (kind, data) in extensions {
            ext.extend(kind.to_be_bytes());
            ext.extend(u16::try_from(data.len()).unwrap().to_be_bytes());
            ext.extend(*data);
        }
        body.extend(u16::try_from(ext.len()).unwrap().to_be_bytes());
        body.extend(ext);
        let mut handshake = vec![2];
        handshake.extend(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
        handshake.extend(body);
        let mut record = vec![22, 0x03, 0x03];
        record.extend(u16::try_from(handshake.len()).unwrap().to_be_bytes());
        record.extend(handshake);
        record
    }

    #[test]
    fn the_group_of_a_tls13_server_hello_is_read() {
        let share = [&[0x11, 0xec, 0x04, 0x60][..], &[7; 1120]].concat();
        let hello = server_hello([1; 32], &[(EXT_SUPPORTED_VERSIONS, &[3, 4]), (EXT_KEY_SHARE, &share)]);
        let parsed = server_hello_in_frame(&frame(8443, &hello)).unwrap();
        assert_eq!(parsed, ServerHello { server_port: 8443, tls13: true, group: Some(0x11ec), hello_retry: false });
        assert_eq!(group_name(parsed.group.unwrap()), "X25519MLKEM768");
        // A HelloRetryRequest is told apart and not counted.
        let retry = server_hello(HELLO_RETRY_RANDOM, &[(EXT_SUPPORTED_VERSIONS, &[3, 4]), (EXT_KEY_SHARE, &[0, 0x1d])]);
        let retry = server_hello_in_frame(&frame(8443, &retry)).unwrap();
        assert!(retry.hello_retry);
        let counted = groups_by_port(&[parsed, retry]);
        assert_eq!(counted[&8443], BTreeMap::from([("X25519MLKEM768".to_owned(), 1)]));
    }

    #[test]
    fn other_traffic_and_truncated_hellos_are_no_hello() {
        let hello = server_hello([1; 32], &[(EXT_SUPPORTED_VERSIONS, &[3, 4]), (EXT_KEY_SHARE, &[0, 0x1d, 0, 32])]);
        assert_eq!(server_hello_in_frame(&frame(443, b"GET / HTTP/1.1\r\n")), None);
        for cut in 0..hello.len() {
            // A hello cut short anywhere parses as nothing or as less than it says, never panics.
            let parsed = server_hello_in_frame(&frame(443, &hello[..cut]));
            assert!(parsed.as_ref().is_none_or(|h| h.group.is_none()), "cut at {cut}: {parsed:?}");
        }
        let tls12 = server_hello([1; 32], &[]);
        assert!(!server_hello_in_frame(&frame(443, &tls12)).unwrap().tls13);
    }
}
