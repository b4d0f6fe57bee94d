//! `HyperTimer` under hyper 1.x: a tiny HTTP/1 server and client over loopback, the server's
//! `header_read_timeout` running on shardwheel: a complete request is answered, a client that
//! never finishes its headers is cut off after the timeout (not before), and `reset` moves a
//! shardwheel sleep in place.

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::rt::Timer as _;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use shardwheel::{HyperTimer, Timer};
use std::convert::Infallible;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HEADER_READ_TIMEOUT: Duration = Duration::from_millis(200);

/// Serves every connection on `listener` with hyper, timing `header_read_timeout` with `timer`.
async fn serve(listener: TcpListener, timer: HyperTimer) {
    loop {
        let (stream, _) = listener.accept().await.expect("accept");
        let timer = timer.clone();
        tokio::spawn(async move {
            let service = service_fn(|_request| async {
                Ok::<_, Infallible>(hyper::Response::new(http_body_util::Full::new(
                    Bytes::from_static(b"hello"),
                )))
            });
            let _ = http1::Builder::new()
                .timer(timer)
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn server(timer: HyperTimer) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(serve(listener, timer));
    address
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_io()
        .build()
        .expect("tokio runtime")
}

#[test]
fn hyper_answers_a_request_with_a_shardwheel_timer() {
    let timer = Timer::builder().shards(1).build().expect("build timer");
    runtime().block_on(async {
        let address = server(HyperTimer::new(timer.clone())).await;
        let stream = TcpStream::connect(address).await.expect("connect");
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(connection);
        let request = hyper::Request::get("/")
            .header("host", "localhost")
            .body(Empty::<Bytes>::new())
            .expect("request");
        let response = sender.send_request(request).await.expect("response");
        assert_eq!(response.status(), 200);
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert_eq!(&body[..], b"hello");
    });
    // The header read timeout ran on shardwheel: scheduled, then cancelled once the headers
    // were in.
    assert!(timer.stats().scheduled >= 1, "{:?}", timer.stats());
}

#[test]
fn header_read_timeout_cuts_off_a_slow_client_on_shardwheel() {
    let timer = Timer::builder().shards(1).build().expect("build timer");
    runtime().block_on(async {
        let address = server(HyperTimer::new(timer.clone())).await;
        // Before connecting: the server may accept and start its header-read timer before
        // this task sees its `connect` complete.
        let started = Instant::now();
        let mut stream = TcpStream::connect(address).await.expect("connect");
        // Half a request line, then nothing: the headers never complete.
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: lo")
            .await
            .expect("write");
        let mut response = Vec::new();
        // The runtime has no tokio timers (no `enable_time`): the watchdog is shardwheel's too.
        let read = timer
            .timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
            .await
            .expect("the server never cut the slow client off");
        let took = started.elapsed();
        // Closed (hyper may first answer 408): after the timeout, not before.
        read.expect("read until closed");
        assert!(took >= HEADER_READ_TIMEOUT, "cut off after {took:?}");
        assert!(took < HEADER_READ_TIMEOUT * 10, "cut off after {took:?}");
        if !response.is_empty() {
            let text = String::from_utf8_lossy(&response);
            assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        }
    });
    let stats = timer.stats();
    assert!(
        stats.fired >= 1,
        "the header read timeout did not fire: {stats:?}"
    );
}

#[test]
fn hyper_timer_resets_a_shardwheel_sleep_in_place() {
    let timer = Timer::builder().shards(1).build().expect("build timer");
    let hyper_timer = HyperTimer::new(timer.clone());
    assert!(hyper_timer.now() >= timer.clock().now() - Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_millis(20);
    futures::executor::block_on(async {
        let mut sleep = hyper_timer.sleep(Duration::from_secs(60));
        let first = std::future::poll_fn(|cx| Poll::Ready(sleep.as_mut().poll(cx))).await;
        assert!(first.is_pending());
        hyper_timer.reset(&mut sleep, deadline);
        sleep.await;
    });
    assert!(Instant::now() >= deadline);
    let stats = timer.stats();
    // One timer, moved: not replaced by a second one.
    assert_eq!((stats.scheduled, stats.reset), (1, 1));
    let waker = std::task::Waker::noop();
    // A sleep from another timer is replaced by one of ours.
    let mut foreign: std::pin::Pin<Box<dyn hyper::rt::Sleep>> = Box::pin(ForeignSleep);
    hyper_timer.reset(&mut foreign, Instant::now());
    assert!(
        foreign
            .as_mut()
            .downcast_mut_pin::<shardwheel::Sleep>()
            .is_some()
    );
    // `Default` uses the process-wide default timer (no other test here touches it).
    let default = HyperTimer::default();
    let mut sleep = default.sleep(Duration::from_secs(60));
    assert!(
        sleep
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
            .is_pending()
    );
    assert_eq!(shardwheel::default_timer().unwrap().pending(), 1);
    assert_eq!(default.timer().pending(), 1);
}

/// A `hyper::rt::Sleep` that is not shardwheel's.
struct ForeignSleep;

impl std::future::Future for ForeignSleep {
    type Output = ();
    fn poll(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        std::task::Poll::Pending
    }
}

impl hyper::rt::Sleep for ForeignSleep {}

#[test]
fn hyper_timer_now_follows_a_manual_clock() {
    let clock = shardwheel::Clock::manual();
    let timer = Timer::builder()
        .shards(1)
        .clock(clock.clone())
        .build()
        .expect("build timer");
    let hyper_timer = HyperTimer::new(timer);
    let before = hyper_timer.now();
    assert_eq!(before, clock.now());
    clock.advance(Duration::from_secs(3600));
    assert_eq!(hyper_timer.now(), before + Duration::from_secs(3600));
}

#[test]
fn hyper_timer_now_on_the_system_clock_is_never_before_instant_now() {
    let hyper_timer = HyperTimer::default();
    // Long enough for the cycle clock's rate to settle and its fast path to be taken.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(100) {
        let before = Instant::now();
        let now = hyper_timer.now();
        assert!(now >= before, "{now:?} before {before:?}");
        assert!(now - before < Duration::from_secs(1));
    }
}
