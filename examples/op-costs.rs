//! What single operations cost on this machine, in nanoseconds: the yardstick for reading
//! instruction counts (callgrind, `examples/server-instructions.sh`) as time.
//!
//! ```sh
//! cargo run --release --example op-costs
//! ```
//!
//! Each line is the min / median / max of 5 timed loops of the operation alone (a loop of plain
//! adds is the baseline): an uncontended atomic read-modify-write on a line this thread owns
//! (`fetch_add`, a `lock xadd`), `Instant::now()` (the vDSO's `clock_gettime`), and on x86-64
//! the cycle counter (`rdtsc`) that `shardwheel`'s cycle clock reads. Callgrind counts each of
//! them as one instruction, or a few dozen for `Instant::now()`. Then two ways to push a
//! pending sleep's deadline back (an idle timeout at each request): `reset(Instant::now() +
//! delay)`, tokio's form, and `reset_after(delay)`, which reads the cycle clock; and (with the
//! `hyper` feature) `HyperTimer::now()`, which hyper reads for each request's header-read
//! deadline. Under callgrind the cycle clock's reading is more instructions than `Instant::now()`
//! (whose system call valgrind counts as a few): here is what each takes in time.

use std::future::Future;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

/// Iterations per timed loop.
const ROUNDS: u64 = 20_000_000;

/// `op`'s time per call in 5 loops, in nanoseconds, sorted.
struct Times(Vec<f64>);

impl std::fmt::Display for Times {
    /// min / median / max.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:6.2} / {:6.2} / {:6.2} ns",
            self.0[0], self.0[2], self.0[4]
        )
    }
}

/// Times `op` in 5 loops.
fn per_call(mut op: impl FnMut(u64)) -> Times {
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            for i in 0..ROUNDS {
                op(black_box(i));
            }
            start.elapsed().as_nanos() as f64 / ROUNDS as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    Times(times)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut sum = 0u64;
    let plain = per_call(|i| sum = black_box(sum.wrapping_add(i)));
    println!("plain add (loop baseline)     {plain}");
    let counter = AtomicU64::new(0);
    let locked = per_call(|i| {
        counter.fetch_add(i, Ordering::Relaxed);
    });
    println!("atomic fetch_add (lock xadd)  {locked}");
    let now = per_call(|_| {
        black_box(Instant::now());
    });
    println!("Instant::now()                {now}");
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` has no preconditions on x86-64; it only reads the counter.
        let cycles = per_call(|_| {
            black_box(unsafe { std::arch::x86_64::_rdtsc() });
        });
        println!("rdtsc                         {cycles}");
    }
    let timer = shardwheel::Timer::builder().shards(1).build()?;
    let mut sleep = std::pin::pin!(timer.sleep(Duration::from_secs(60)));
    let mut context = Context::from_waker(Waker::noop());
    assert!(sleep.as_mut().poll(&mut context).is_pending());
    let reset = per_call(|_| {
        sleep
            .as_mut()
            .reset(Instant::now() + Duration::from_secs(60));
    });
    println!("Sleep::reset(now + 60 s)      {reset}");
    let reset_after = per_call(|_| {
        sleep.as_mut().reset_after(Duration::from_secs(60));
    });
    println!("Sleep::reset_after(60 s)      {reset_after}");
    #[cfg(feature = "hyper")]
    {
        use hyper::rt::Timer as _;
        let hyper_timer = shardwheel::HyperTimer::default();
        let now = per_call(|_| {
            black_box(hyper_timer.now());
        });
        println!("HyperTimer::now()             {now}");
    }
    black_box(sum);
    Ok(())
}
