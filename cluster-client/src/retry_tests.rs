//! The client's retry layer against a loopback HTTP server that sheds load as an API server does
//! (API Priority and Fairness answers 429 with `Retry-After: 1`; this one asks for 2 s so the wait
//! stands apart from the retry policy's own backoff, which starts at 5 ms).
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

const SHED: &str =
    "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
const OK: &str = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok";

/// Answers the first request with `SHED`, every later one with `OK`; returns its port and when
/// each request arrived.
async fn shedding_server() -> (u16, Arc<Mutex<Vec<Instant>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&arrivals);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 16 * 1024];
                // A GET without a body: each read that ends the headers is one request.
                let mut pending = Vec::new();
                while let Ok(n) = stream.read(&mut buffer).await {
                    if n == 0 {
                        return;
                    }
                    pending.extend_from_slice(&buffer[..n]);
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        pending.drain(..end + 4);
                        let first = {
                            let mut seen = seen.lock().unwrap();
                            seen.push(Instant::now());
                            seen.len() == 1
                        };
                        let answer = if first { SHED } else { OK };
                        if stream.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (port, arrivals)
}

#[tokio::test]
async fn a_429_is_retried_once_the_servers_retry_after_has_passed() {
    let (port, arrivals) = shedding_server().await;
    let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
    assert!(config.default_retry, "kube's configurations retry by default");
    let client = client_for(config, Options::default()).unwrap();
    let request = http::Request::get("/healthz").body(Vec::new()).unwrap();
    let answer = client.request_text(request).await.unwrap();
    assert_eq!(answer, "ok", "the retry's answer is the caller's");
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 2, "one 429, one retry");
    let waited = arrivals[1] - arrivals[0];
    assert!(waited >= Duration::from_millis(1900), "retried after {waited:?}, before the 2 s Retry-After");
}
