//! Smoke test of the example server (`examples/server.rs`): with each timer backend it starts on
//! loopback, answers keep-alive requests from a plain `TcpStream` client, and stops by itself
//! after `--seconds` with a connection still open; with a timer, an idle connection is closed
//! once its idle timeout (reset at each request) has passed, never before.
#![cfg(feature = "hyper")]

#[allow(dead_code)]
#[path = "../examples/server.rs"]
mod server;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// The server's statics count for the whole process: one run at a time.
static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

type RunResult = Result<server::Report, String>;

/// Starts the server with `args` on a free loopback port, on its own thread.
fn start(args: &[&str]) -> Result<(SocketAddr, Receiver<RunResult>), Box<dyn std::error::Error>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let config = server::Config::from_args(args.iter().map(|a| a.to_string()))?;
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(server::run(&config, listener).map_err(|error| error.to_string()));
    });
    Ok((addr, finished))
}

/// The server's report, once it has stopped by itself (within `limit`).
fn finish(finished: Receiver<RunResult>, limit: Duration) -> server::Report {
    finished
        .recv_timeout(limit)
        .expect("the server did not stop by itself")
        .expect("the server failed")
}

/// A keep-alive HTTP/1.1 client on a plain `TcpStream`.
struct Client {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Result<Client, Box<dyn std::error::Error>> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Client { stream, reader })
    }

    /// Sends a GET request and checks the response.
    fn get(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        self.stream
            .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
        let mut status = String::new();
        self.reader.read_line(&mut status)?;
        assert!(status.starts_with("HTTP/1.1 200"), "status line {status:?}");
        let mut length = None;
        loop {
            let mut header = String::new();
            self.reader.read_line(&mut header)?;
            if header == "\r\n" {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = Some(value.trim().parse::<usize>()?);
            }
        }
        let mut body = vec![0; length.ok_or("no content-length")?];
        self.reader.read_exact(&mut body)?;
        assert_eq!(body, b"Hello, world!\n");
        Ok(())
    }

    /// Waits for the server to close the connection.
    fn wait_closed(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        let mut rest = Vec::new();
        self.reader.read_to_end(&mut rest)?;
        assert!(rest.is_empty(), "unexpected bytes {rest:?}");
        Ok(())
    }
}

#[test]
fn serves_and_stops_by_itself_with_each_timer() -> Result<(), Box<dyn std::error::Error>> {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for timer in ["none", "hyper-only", "hyper-boxed", "tokio", "shardwheel"] {
        let started = Instant::now();
        let (addr, finished) = start(&["--timer", timer, "--workers", "2", "--seconds", "1"])?;
        let mut first = Client::connect(addr)?;
        for _ in 0..3 {
            first.get()?;
        }
        drop(first);
        let mut open = Client::connect(addr)?;
        open.get()?;
        open.get()?;
        let report = finish(finished, Duration::from_secs(10));
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

/// Requests 0.4 s apart keep a connection with a 1 s idle timeout open past 1 s (each resets it);
/// after the last one it is closed 1 s later, not before.
#[test]
fn the_idle_timeout_is_reset_at_each_request_and_closes_the_connection()
-> Result<(), Box<dyn std::error::Error>> {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let idle = Duration::from_secs(1);
    for timer in ["tokio", "shardwheel"] {
        let (addr, finished) = start(&[
            "--timer",
            timer,
            "--workers",
            "2",
            "--seconds",
            "4",
            "--idle-seconds",
            "1",
        ])?;
        let mut client = Client::connect(addr)?;
        client.get()?;
        let mut last_sent = Instant::now();
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(400));
            last_sent = Instant::now();
            client.get()?;
        }
        // The server reset the idle timeout after the last request was sent.
        client.wait_closed()?;
        let closed_after = last_sent.elapsed();
        assert!(
            closed_after >= idle,
            "{timer}: closed {closed_after:?} after the last request"
        );
        assert!(
            closed_after < idle + Duration::from_secs(2),
            "{timer}: {closed_after:?}"
        );
        let report = finish(finished, Duration::from_secs(10));
        assert_eq!(report.idle_closed, 1, "{timer}: {}", report.json());
        assert_eq!(report.requests, 4, "{timer}: {}", report.json());
    }
    Ok(())
}
