//! Loopback ports for the processes a test starts.
//!
//! A port found by binding `127.0.0.1:0` comes from the kernel's ephemeral range, the same range
//! outgoing connections take their local ports from. Between releasing it and the child binding
//! it, any connection on the machine (the API server's own to etcd, a client's to the API server)
//! may take it, and the child fails with "address already in use". Ports below that range are
//! never given to outgoing connections; each is also handed out once per test process and checked
//! free by binding it.

use std::net::TcpListener;
use std::sync::Mutex;

/// The lowest port handed out: above the well-known and most registered service ports.
const FLOOR: u16 = 20_000;

/// Where the next search starts; spread by process id so that two test processes (a test run
/// beside `make demo`) rarely probe the same ports.
static NEXT: Mutex<Option<u16>> = Mutex::new(None);

/// A free loopback TCP port outside the ephemeral range, never returned before by this process.
pub fn free_port() -> std::io::Result<u16> {
    let ceiling = ephemeral_floor();
    let span = ceiling.saturating_sub(FLOOR).max(1);
    let mut next = NEXT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut candidate = next.unwrap_or_else(|| FLOOR + (std::process::id() % u32::from(span)) as u16);
    for _ in 0..span {
        let port = candidate;
        candidate = if candidate + 1 >= ceiling { FLOOR } else { candidate + 1 };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            *next = Some(candidate);
            return Ok(port);
        }
    }
    // Every port below the ephemeral range is taken or was handed out: fall back to the kernel's
    // choice rather than fail.
    TcpListener::bind("127.0.0.1:0")?.local_addr().map(|a| a.port())
}

/// The first port of the kernel's ephemeral range (Linux's default when it cannot be read).
fn ephemeral_floor() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|&low| low > FLOOR + 1_000)
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_free_and_never_repeated() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "a port was handed out twice: {ports:?}");
        for port in ports {
            assert!((FLOOR..ephemeral_floor()).contains(&port), "{port} is not below the ephemeral range");
            TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|e| panic!("{port} is not free: {e}"));
        }
    }

    #[test]
    fn a_port_in_use_is_skipped() {
        let taken = free_port().unwrap();
        let _held = TcpListener::bind(("127.0.0.1", taken)).unwrap();
        // The next search starts right after `taken`; occupy that one too.
        let after = if taken + 1 >= ephemeral_floor() { FLOOR } else { taken + 1 };
        let _held_after = TcpListener::bind(("127.0.0.1", after));
        let port = free_port().unwrap();
        assert_ne!(port, taken);
        assert_ne!(port, after);
    }
}
