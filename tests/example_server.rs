//! Smoke test of the example server (`examples/server.rs`): with each timer backend it starts on
//! loopback, answers keep-alive requests from a plain `TcpStream` client, and stops by itself
//! after `--seconds` with a connection still open.
#![cfg(feature = "hyper")]

#[allow(dead_code)]
#[path = "../examples/server.rs"]
mod server;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Sends `count` GET requests on one connection, checking each response; returns the connection,
/// still open.
fn get(addr: SocketAddr, count: usize) -> Result<TcpStream, Box<dyn std::error::Error>> {
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    for _ in 0..count {
        (&stream).write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
        let mut status = String::new();
        reader.read_line(&mut status)?;
        assert!(status.starts_with("HTTP/1.1 200"), "status line {status:?}");
        let mut length = None;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header)?;
            if header == "\r\n" {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = Some(value.trim().parse::<usize>()?);
                }
            }
        }
        let mut body = vec![0; length.ok_or("no content-length")?];
        reader.read_exact(&mut body)?;
        assert_eq!(body, b"Hello, world!\n");
    }
    Ok(stream)
}

/// The server's statics count for the whole process: one run at a time.
#[test]
fn serves_and_stops_by_itself_with_each_timer() -> Result<(), Box<dyn std::error::Error>> {
    for timer in ["none", "tokio", "shardwheel"] {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let config = server::Config::from_args(
            ["--timer", timer, "--workers", "2", "--seconds", "1"]
                .into_iter()
                .map(String::from),
        )?;
        let started = Instant::now();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(server::run(&config, listener).map_err(|error| error.to_string()));
        });
        let first = get(addr, 3)?;
        drop(first);
        let _open = get(addr, 2)?;
        let report = finished
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{timer}: the server did not stop by itself"))?;
        let took = started.elapsed();
        assert!(took < Duration::from_secs(10), "{timer}: ran {took:?}");
        assert_eq!(report.timer, timer);
        assert_eq!(report.requests, 5, "{timer}: {}", report.json());
        assert_eq!(report.connections, 2, "{timer}: {}", report.json());
        assert_eq!(report.request_timeouts, 0);
        assert!(
            report.json().contains("\"requests\":5"),
            "{}",
            report.json()
        );
    }
    Ok(())
}

#[test]
fn bad_flags_are_errors() {
    let parse = |args: &[&str]| server::Config::from_args(args.iter().map(|a| a.to_string()));
    assert!(parse(&["--workers", "0"]).is_err());
    assert!(parse(&["--seconds", "-1"]).is_err());
    assert!(parse(&["--seconds"]).is_err());
    assert!(parse(&["--bogus"]).is_err());
    assert!(parse(&["--timer", "tokio"]).is_ok());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let config = parse(&["--timer", "nope", "--seconds", "1"]).unwrap();
    assert!(server::run(&config, listener).is_err());
}
