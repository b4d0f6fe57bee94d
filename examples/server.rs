//! An HTTP/1.1 server (hyper 1.x on tokio) whose timeouts run on a timer chosen at run time:
//! the yardstick of the timer's cost in a real server.
//!
//! ```sh
//! cargo run --release --features hyper --example server -- --timer shardwheel --seconds 10
//! ```
//!
//! Flags: `--timer shardwheel|tokio|none|hyper-only|hyper-boxed` (default shardwheel), `--addr 127.0.0.1:PORT` (default
//! 127.0.0.1:8080), `--workers N` (tokio worker threads; default: available parallelism),
//! `--seconds S` (the server stops by itself after S seconds; default 10), `--idle-seconds S`
//! (the connection idle timeout; default 60). At exit it prints one
//! JSON line: requests served, its own CPU time (user + system, `getrusage`) and CPU per request,
//! and on shardwheel the timers its engine scheduled and cancelled (`Stats`; a sleep that takes
//! over the timer its connection's previous sleep kept schedules none).
//!
//! Every backend runs the same code ([`serve_connection`] is generic over [`Backend`]), with
//! three timeouts:
//!
//! | timeout | duration | set | tokio | shardwheel | none | hyper-only | hyper-boxed |
//! |---|---|---|---|---|---|---|---|
//! | hyper's header read | 30 s | each request's head | `TokioTimer` | `shardwheel::HyperTimer` | off | a timer whose sleeps never fire | the same, each sleep on the heap |
//! | request | 30 s | wraps each request's response future | `tokio::time::timeout` | `shardwheel::timeout` | off | off | off |
//! | connection idle | 60 s | one `Sleep` per connection, reset after each request | `tokio::time::sleep` (`reset(Instant::now() + d)`) | `shardwheel::sleep` (`reset_after(d)`) | off | off | off |
//!
//! `none` is the floor: what the server costs without any timer. `hyper-only` is what hyper
//! adds once it has a timer at all, whichever: with a header-read timeout it reads once more
//! after each request's head (to start the next one's timeout) and boxes a sleep per request.
//! `hyper-boxed` adds that box's allocation (its sleep holds the deadline, as any timer's must;
//! `hyper-only`'s is zero-sized, so its box allocates nothing): together, what hyper costs with
//! any timer, before the timer does any work of its own.
//! Only the tokio backend turns on tokio's time driver, so each backend pays for its own timer
//! only. `examples/server-bench.sh` runs them under `wrk` and prints requests/s and CPU per
//! request; `examples/server-instructions.sh` counts instructions per request under callgrind.

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::error::Error;
use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use tokio::net::TcpStream;

/// Hyper's limit on reading a request's head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The limit on answering one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection with no request for this long is closed (`--idle-seconds`).
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The timer a server runs on: the only code that differs between the backends.
trait Backend: 'static {
    /// The name `--timer` takes.
    const NAME: &'static str;
    /// Whether the tokio runtime needs its time driver.
    const TOKIO_TIME: bool;
    /// The future of [`Backend::sleep`].
    type Sleep: Future<Output = ()> + Send + 'static;
    /// A future that completes once `delay` has passed.
    fn sleep(delay: Duration) -> Self::Sleep;
    /// Moves `sleep`'s deadline to `delay` from now.
    fn reset(sleep: Pin<&mut Self::Sleep>, delay: Duration);
    /// Runs `future` with a deadline `delay` from now (`Err(TimedOut)` past it).
    fn timeout<F: Future + Send>(
        delay: Duration,
        future: F,
    ) -> impl Future<Output = Result<F::Output, TimedOut>> + Send;
    /// Sets hyper's timer and header-read timeout.
    fn configure(builder: &mut http1::Builder);
    /// The timers its engine has scheduled and cancelled so far, where it counts them.
    fn timer_counts() -> Option<(u64, u64)> {
        None
    }
}

/// A request that outlived [`REQUEST_TIMEOUT`].
struct TimedOut;

/// tokio's own timer (`tokio::time`), as a tokio/hyper server has it.
struct TokioBackend;

impl Backend for TokioBackend {
    const NAME: &'static str = "tokio";
    const TOKIO_TIME: bool = true;
    type Sleep = tokio::time::Sleep;

    fn sleep(delay: Duration) -> Self::Sleep {
        tokio::time::sleep(delay)
    }

    fn reset(sleep: Pin<&mut Self::Sleep>, delay: Duration) {
        sleep.reset(tokio::time::Instant::now() + delay);
    }

    fn timeout<F: Future + Send>(
        delay: Duration,
        future: F,
    ) -> impl Future<Output = Result<F::Output, TimedOut>> + Send {
        let timeout = tokio::time::timeout(delay, future);
        async move { timeout.await.map_err(|_| TimedOut) }
    }

    fn configure(builder: &mut http1::Builder) {
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
    }
}

/// shardwheel's process-wide timer: the same server after the switch (see the README).
struct ShardwheelBackend;

impl Backend for ShardwheelBackend {
    const NAME: &'static str = "shardwheel";
    const TOKIO_TIME: bool = false;
    type Sleep = shardwheel::Sleep;

    fn sleep(delay: Duration) -> Self::Sleep {
        shardwheel::sleep(delay)
    }

    fn reset(sleep: Pin<&mut Self::Sleep>, delay: Duration) {
        sleep.reset_after(delay);
    }

    fn timeout<F: Future + Send>(
        delay: Duration,
        future: F,
    ) -> impl Future<Output = Result<F::Output, TimedOut>> + Send {
        let timeout = shardwheel::timeout(delay, future);
        async move { timeout.await.map_err(|_| TimedOut) }
    }

    fn configure(builder: &mut http1::Builder) {
        builder
            .timer(shardwheel::HyperTimer::default())
            .header_read_timeout(HEADER_READ_TIMEOUT);
    }

    fn timer_counts() -> Option<(u64, u64)> {
        let stats = shardwheel::default_timer().ok()?.stats();
        Some((stats.scheduled, stats.cancelled))
    }
}

/// No timer at all: the floor the other two are measured against.
struct NoTimer;

impl Backend for NoTimer {
    const NAME: &'static str = "none";
    const TOKIO_TIME: bool = false;
    type Sleep = std::future::Pending<()>;

    fn sleep(_: Duration) -> Self::Sleep {
        std::future::pending()
    }

    fn reset(_: Pin<&mut Self::Sleep>, _: Duration) {}

    async fn timeout<F: Future + Send>(_: Duration, future: F) -> Result<F::Output, TimedOut> {
        Ok(future.await)
    }

    fn configure(builder: &mut http1::Builder) {
        builder.header_read_timeout(None);
    }
}

/// hyper's header-read timeout on a timer that costs nothing (its sleeps never fire), and no
/// other timeout: what hyper itself does differently once it has a timer, whichever timer that
/// is (`hyper-only`). `BOXED` (`hyper-boxed`): each sleep on the heap, as a real timer's is,
/// hyper boxing every sleep its timer returns and dropping it after each request's head (see
/// [`NeverTimer`]). A timer's share above this floor is the timer's own work.
struct HyperOnly<const BOXED: bool>;

/// As [`NoTimer`] but for hyper's timer.
impl<const BOXED: bool> Backend for HyperOnly<BOXED> {
    const NAME: &'static str = if BOXED { "hyper-boxed" } else { "hyper-only" };
    const TOKIO_TIME: bool = false;
    type Sleep = <NoTimer as Backend>::Sleep;

    fn sleep(delay: Duration) -> Self::Sleep {
        NoTimer::sleep(delay)
    }

    fn reset(sleep: Pin<&mut Self::Sleep>, delay: Duration) {
        NoTimer::reset(sleep, delay)
    }

    fn timeout<F: Future + Send>(
        delay: Duration,
        future: F,
    ) -> impl Future<Output = Result<F::Output, TimedOut>> + Send {
        NoTimer::timeout(delay, future)
    }

    fn configure(builder: &mut http1::Builder) {
        builder
            .timer(NeverTimer::<BOXED>)
            .header_read_timeout(HEADER_READ_TIMEOUT);
    }
}

/// A hyper timer whose sleeps never complete. `BOXED`: each sleep holds its deadline, as any
/// timer's must, so boxing one allocates; else they are zero-sized, and boxing one allocates
/// nothing.
#[derive(Clone, Copy, Debug)]
struct NeverTimer<const BOXED: bool>;

/// [`NeverTimer`]'s sleep, holding its deadline or nothing.
struct NeverSleep<T> {
    _held: T,
}

impl<T> Future for NeverSleep<T> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut std::task::Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

impl<T: Send + Sync + 'static> hyper::rt::Sleep for NeverSleep<T> {}

impl<const BOXED: bool> hyper::rt::Timer for NeverTimer<BOXED> {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(std::time::Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        if BOXED {
            Box::pin(NeverSleep { _held: deadline })
        } else {
            Box::pin(NeverSleep { _held: () })
        }
    }
}

/// The server's settings (the command line's flags).
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) timer: String,
    pub(crate) addr: SocketAddr,
    pub(crate) workers: usize,
    pub(crate) seconds: f64,
    pub(crate) idle_timeout: Duration,
}

impl Config {
    pub(crate) fn from_args(
        mut args: impl Iterator<Item = String>,
    ) -> Result<Config, Box<dyn Error>> {
        let mut config = Config {
            timer: ShardwheelBackend::NAME.to_string(),
            addr: "127.0.0.1:8080".parse()?,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            seconds: 10.0,
            idle_timeout: IDLE_TIMEOUT,
        };
        while let Some(flag) = args.next() {
            let mut value = || args.next().ok_or(format!("{flag} needs a value"));
            match flag.as_str() {
                "--timer" => config.timer = value()?,
                "--addr" => config.addr = value()?.parse()?,
                "--workers" => config.workers = value()?.parse()?,
                "--seconds" => config.seconds = value()?.parse()?,
                "--idle-seconds" => {
                    config.idle_timeout = Duration::try_from_secs_f64(value()?.parse()?)?
                }
                "-h" | "--help" => {
                    return Err(
                        "usage: server [--timer shardwheel|tokio|none|hyper-only|hyper-boxed] [--addr IP:PORT] \
                                [--workers N] [--seconds S] [--idle-seconds S]"
                            .into(),
                    );
                }
                _ => return Err(format!("unknown flag {flag} (see --help)").into()),
            }
        }
        if config.workers == 0 {
            return Err("--workers must be at least 1".into());
        }
        if !(config.seconds.is_finite() && config.seconds > 0.0) {
            return Err("--seconds must be a positive number".into());
        }
        Ok(config)
    }
}

/// What a run did: the line printed at exit.
#[derive(Clone, Debug)]
pub(crate) struct Report {
    pub(crate) timer: &'static str,
    pub(crate) workers: usize,
    pub(crate) seconds: f64,
    pub(crate) connections: u64,
    pub(crate) idle_closed: u64,
    pub(crate) requests: u64,
    pub(crate) request_timeouts: u64,
    pub(crate) cpu_user_us: u64,
    pub(crate) cpu_system_us: u64,
    /// Timers scheduled and cancelled during the run (shardwheel only).
    pub(crate) timer_counts: Option<(u64, u64)>,
}

impl Report {
    pub(crate) fn json(&self) -> String {
        let cpu_us = self.cpu_user_us + self.cpu_system_us;
        let per_request = if self.requests == 0 {
            0.0
        } else {
            cpu_us as f64 / self.requests as f64
        };
        format!(
            "{{\"timer\":\"{}\",\"workers\":{},\"seconds\":{},\"connections\":{},\
             \"idle_closed\":{},\"requests\":{},\"request_timeouts\":{},\"cpu_user_us\":{},\
             \"cpu_system_us\":{},\"cpu_us_per_request\":{:.3}{}}}",
            self.timer,
            self.workers,
            self.seconds,
            self.connections,
            self.idle_closed,
            self.requests,
            self.request_timeouts,
            self.cpu_user_us,
            self.cpu_system_us,
            per_request,
            match self.timer_counts {
                Some((scheduled, cancelled)) =>
                    format!(",\"timers_scheduled\":{scheduled},\"timers_cancelled\":{cancelled}"),
                None => String::new(),
            }
        )
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let config = Config::from_args(std::env::args().skip(1))?;
    let listener = std::net::TcpListener::bind(config.addr)?;
    eprintln!(
        "server: {} timer, {} workers, listening on {} for {} s",
        config.timer,
        config.workers,
        listener.local_addr()?,
        config.seconds
    );
    let report = run(&config, listener)?;
    println!("{}", report.json());
    Ok(())
}

/// Serves on `listener` for `config.seconds`, then returns what it did.
pub(crate) fn run(
    config: &Config,
    listener: std::net::TcpListener,
) -> Result<Report, Box<dyn Error>> {
    match config.timer.as_str() {
        TokioBackend::NAME => run_on::<TokioBackend>(config, listener),
        ShardwheelBackend::NAME => run_on::<ShardwheelBackend>(config, listener),
        NoTimer::NAME => run_on::<NoTimer>(config, listener),
        HyperOnly::<false>::NAME => run_on::<HyperOnly<false>>(config, listener),
        HyperOnly::<true>::NAME => run_on::<HyperOnly<true>>(config, listener),
        other => Err(format!(
            "unknown timer {other:?}: shardwheel, tokio, none, hyper-only or hyper-boxed"
        )
        .into()),
    }
}

/// Counts kept per worker thread (one writer each), summed at exit.
#[derive(Default)]
struct Counts {
    requests: AtomicU64,
}

/// Every thread's [`Counts`]. These statics count for the whole process: [`run`] reports the
/// difference between its start and its end, so runs in one process must not overlap.
static ALL_COUNTS: Mutex<Vec<Arc<Counts>>> = Mutex::new(Vec::new());
static CONNECTIONS: AtomicU64 = AtomicU64::new(0);
static IDLE_CLOSED: AtomicU64 = AtomicU64::new(0);
static REQUEST_TIMEOUTS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTS: Arc<Counts> = {
        let counts = Arc::new(Counts::default());
        ALL_COUNTS.lock().unwrap_or_else(|e| e.into_inner()).push(counts.clone());
        counts
    };
}

fn count_requests(served: u64) {
    COUNTS.with(|counts| {
        // One writer per counter: a plain add, no locked instruction.
        let total = counts.requests.load(Ordering::Relaxed);
        counts.requests.store(total + served, Ordering::Relaxed);
    });
}

fn run_on<B: Backend>(
    config: &Config,
    listener: std::net::TcpListener,
) -> Result<Report, Box<dyn Error>> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(config.workers).enable_io();
    if B::TOKIO_TIME {
        runtime.enable_time();
    }
    let runtime = runtime.build()?;
    // One builder (and one timer) for all connections.
    let mut builder = http1::Builder::new();
    B::configure(&mut builder);
    let builder = Arc::new(builder);
    let idle_timeout = config.idle_timeout;
    // The stop signal comes from a plain thread, so no backend needs tokio's timer for it.
    let (stop_sender, mut stop) = tokio::sync::oneshot::channel::<()>();
    let seconds = config.seconds;
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs_f64(seconds));
        let _ = stop_sender.send(());
    });
    let requests_before = total_requests();
    let connections_before = CONNECTIONS.load(Ordering::Relaxed);
    let idle_before = IDLE_CLOSED.load(Ordering::Relaxed);
    let timeouts_before = REQUEST_TIMEOUTS.load(Ordering::Relaxed);
    let cpu_before = cpu_time_us();
    let timers_before = B::timer_counts();
    listener.set_nonblocking(true)?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        CONNECTIONS.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(serve_connection::<B>(builder.clone(), stream, idle_timeout));
                    }
                    Err(error) => eprintln!("server: accept: {error}"),
                },
            }
        }
        Ok::<(), std::io::Error>(())
    })?;
    let (cpu_user_us, cpu_system_us) = cpu_time_us();
    let timer_counts = B::timer_counts()
        .zip(timers_before)
        .map(|(after, before)| (after.0 - before.0, after.1 - before.1));
    let report = Report {
        timer: B::NAME,
        workers: config.workers,
        seconds: config.seconds,
        connections: CONNECTIONS.load(Ordering::Relaxed) - connections_before,
        idle_closed: IDLE_CLOSED.load(Ordering::Relaxed) - idle_before,
        requests: total_requests() - requests_before,
        request_timeouts: REQUEST_TIMEOUTS.load(Ordering::Relaxed) - timeouts_before,
        cpu_user_us: cpu_user_us - cpu_before.0,
        cpu_system_us: cpu_system_us - cpu_before.1,
        timer_counts,
    };
    // Open connections are dropped with their tasks, not drained.
    runtime.shutdown_background();
    Ok(report)
}

fn total_requests() -> u64 {
    let all = ALL_COUNTS.lock().unwrap_or_else(|e| e.into_inner());
    all.iter().map(|c| c.requests.load(Ordering::Relaxed)).sum()
}

/// Serves one connection until the client closes it, it fails, or it has been idle for
/// `idle_timeout`.
async fn serve_connection<B: Backend>(
    builder: Arc<http1::Builder>,
    stream: TcpStream,
    idle_timeout: Duration,
) {
    let _ = stream.set_nodelay(true);
    // Requests started on this connection: the service counts, the loop below resets the idle
    // timeout when the count moves. Both run in this task (hyper polls the service inline).
    let started = Arc::new(AtomicU64::new(0));
    let service = {
        let started = started.clone();
        service_fn(move |request: Request<Incoming>| {
            started.store(started.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            let response = B::timeout(REQUEST_TIMEOUT, respond(request));
            async move {
                Ok::<_, Infallible>(match response.await {
                    Ok(response) => response,
                    Err(TimedOut) => {
                        REQUEST_TIMEOUTS.fetch_add(1, Ordering::Relaxed);
                        let mut response = Response::new(Full::new(Bytes::new()));
                        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                        response
                    }
                })
            }
        })
    };
    let mut connection = pin!(builder.serve_connection(TokioIo::new(stream), service));
    let mut idle = pin!(B::sleep(idle_timeout));
    let mut seen = 0;
    let idle_fired = poll_fn(|cx| {
        let done = connection.as_mut().poll(cx).is_ready();
        let now = started.load(Ordering::Relaxed);
        if now != seen {
            count_requests(now - seen);
            seen = now;
            B::reset(idle.as_mut(), idle_timeout);
        }
        if done {
            Poll::Ready(false)
        } else {
            idle.as_mut().poll(cx).map(|()| true)
        }
    })
    .await;
    if idle_fired {
        // Dropping the connection closes it.
        IDLE_CLOSED.fetch_add(1, Ordering::Relaxed);
    }
}

/// The application: a fixed greeting.
async fn respond(_: Request<Incoming>) -> Response<Full<Bytes>> {
    Response::new(Full::new(Bytes::from_static(b"Hello, world!\n")))
}

/// This process's CPU time so far: (user, system) in microseconds.
fn cpu_time_us() -> (u64, u64) {
    // SAFETY: `getrusage` only writes the `rusage` it is given, which is plain data (all zeros
    // is a valid value).
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(usage.ru_utime), us(usage.ru_stime))
}
