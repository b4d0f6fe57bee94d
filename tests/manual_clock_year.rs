//! A year of simulated time on a manual clock, in a fraction of a second of real time: timers
//! on every wheel level (deadlines from 1 ns to 365 days, log-uniform, plus the level
//! boundaries 64^k ms and their neighbours), each checked to run exactly at its tick.
//!
//! Two ways through the year:
//! * stepping to 1 ms before each deadline tick, then 1 ms onto it: every timer must run on
//!   the step onto its tick, with `clock.now()` (read inside the task) equal to its deadline
//!   rounded up to the 1 ms tick, and none may run on the step before;
//! * random steps of any length (1 ns to a day): every timer must run on the first step whose
//!   tick reaches its deadline tick, no earlier and no later.

#[path = "async_support.rs"]
mod support;

use shardwheel::{Clock, Executor, Timer};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use support::Rng;

const MS: u64 = 1_000_000;
const DAY_MS: u64 = 86_400_000;
const YEAR_MS: u64 = 365 * DAY_MS;
const RANDOM_TIMERS: usize = 10_000;
const NOT_FIRED: u64 = u64::MAX;

/// What the tasks record: when (manual-clock nanoseconds since the origin) each timer ran.
struct Fired {
    clock: Clock,
    origin: Instant,
    at: Vec<AtomicU64>,
    count: AtomicUsize,
}

impl Fired {
    fn record(&self, id: usize) {
        let now = u64::try_from((self.clock.now() - self.origin).as_nanos()).unwrap();
        let before = self.at[id].swap(now, Ordering::SeqCst);
        assert_eq!(before, NOT_FIRED, "timer {id} ran twice");
        self.count.fetch_add(1, Ordering::SeqCst);
    }
}

/// Delays in nanoseconds: log-uniform over every wheel level up to a year (half of them off
/// the millisecond grid), plus each level boundary 64^k ms with its neighbours.
fn delays(rng: &mut Rng, count: usize, max_ms: u64) -> Vec<u64> {
    let mut delays = Vec::with_capacity(count + 64);
    let top_bit = 63 - max_ms.leading_zeros() as u64;
    for _ in 0..count {
        let bit = rng.between(0, top_bit);
        let millis = rng.between(1 << bit, (2 << bit) - 1).min(max_ms);
        let nanos = if rng.next_u64().is_multiple_of(2) {
            millis * MS
        } else {
            millis * MS - rng.between(0, MS - 1)
        };
        delays.push(nanos);
    }
    let mut boundary = 64;
    while boundary <= max_ms {
        for millis in [boundary - 1, boundary, boundary + 1] {
            delays.push(millis * MS);
        }
        delays.push(boundary * MS - 1);
        delays.push(boundary * MS + 1);
        boundary *= 64;
    }
    delays.extend([1, MS, max_ms * MS]);
    delays
}

/// A manual clock, an inline timer on it, and room to record `capacity` timers.
fn setup(capacity: usize) -> (Clock, Timer, Arc<Fired>) {
    let clock = Clock::manual();
    let timer = Timer::builder()
        .clock(clock.clone())
        .shards(2)
        .executor(Executor::Inline)
        .build()
        .unwrap();
    let fired = Arc::new(Fired {
        clock: clock.clone(),
        origin: clock.now(),
        at: (0..capacity).map(|_| AtomicU64::new(NOT_FIRED)).collect(),
        count: AtomicUsize::new(0),
    });
    (clock, timer, fired)
}

/// Schedules one timer per delay (from two threads, so both shards get timers) with ids from
/// `first_id`; returns each id's deadline tick given that the clock reads `now_ns`.
fn schedule(
    timer: &Timer,
    fired: &Arc<Fired>,
    first_id: usize,
    delays: &[u64],
    now_ns: u64,
) -> Vec<(usize, u64)> {
    let half = delays.len() / 2;
    std::thread::scope(|scope| {
        for (offset, part) in [(0, &delays[..half]), (half, &delays[half..])] {
            scope.spawn(move || {
                for (index, &delay) in part.iter().enumerate() {
                    let id = first_id + offset + index;
                    let fired = fired.clone();
                    timer
                        .schedule(Duration::from_nanos(delay), move || fired.record(id))
                        .unwrap();
                }
            });
        }
    });
    delays
        .iter()
        .enumerate()
        .map(|(index, &delay)| (first_id + index, (now_ns + delay).div_ceil(MS)))
        .collect()
}

#[test]
fn a_year_in_1ms_steps_onto_each_deadline_fires_every_timer_exactly_at_its_tick() {
    let mut rng = Rng::new(2024);
    let batch = delays(&mut rng, RANDOM_TIMERS, YEAR_MS);
    // A second batch is scheduled mid-year, when the wheel is far from its origin.
    let later = delays(&mut rng, RANDOM_TIMERS / 4, 180 * DAY_MS);
    let (clock, timer, fired) = setup(batch.len() + later.len());
    let started = Instant::now();

    let mut by_tick: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (id, tick) in schedule(&timer, &fired, 0, &batch, 0) {
        by_tick.entry(tick).or_default().push(id);
    }
    let mid_year = 183 * DAY_MS + 12_345;
    let mut later_scheduled = false;
    let mut now_ms = 0u64;
    let mut due = 0usize;
    let mut advances = 0u64;
    while let Some((&tick, _)) = by_tick.range(now_ms + 1..).next() {
        if !later_scheduled && tick > mid_year {
            clock.advance(Duration::from_millis(mid_year - now_ms));
            advances += 1;
            now_ms = mid_year;
            assert_eq!(fired.count.load(Ordering::SeqCst), due, "at {now_ms} ms");
            for (id, tick) in schedule(&timer, &fired, batch.len(), &later, now_ms * MS) {
                by_tick.entry(tick).or_default().push(id);
            }
            later_scheduled = true;
            continue;
        }
        if tick - 1 > now_ms {
            clock.advance(Duration::from_millis(tick - 1 - now_ms));
            advances += 1;
            now_ms = tick - 1;
            assert_eq!(
                fired.count.load(Ordering::SeqCst),
                due,
                "something ran early, at {now_ms} ms"
            );
        }
        clock.advance(Duration::from_millis(1));
        advances += 1;
        now_ms = tick;
        for &id in &by_tick[&tick] {
            let at = fired.at[id].load(Ordering::SeqCst);
            assert_eq!(
                at,
                tick * MS,
                "timer {id} due at tick {tick} ran at {at} ns"
            );
        }
        due += by_tick[&tick].len();
        assert_eq!(fired.count.load(Ordering::SeqCst), due, "at {now_ms} ms");
    }
    let took = started.elapsed();
    assert!(later_scheduled);
    assert_eq!(due, batch.len() + later.len());
    assert_eq!(timer.pending(), 0);
    assert_eq!(timer.stats().fired, due as u64);
    assert!(now_ms >= YEAR_MS);
    eprintln!(
        "{due} timers over {:.1} simulated days in {advances} advances: {took:?} real time",
        now_ms as f64 / DAY_MS as f64
    );
    assert!(
        took < Duration::from_secs(30),
        "a simulated year took {took:?}"
    );
}

#[test]
fn a_year_in_random_steps_fires_every_timer_on_the_first_step_reaching_its_tick() {
    let mut rng = Rng::new(77);
    let batch = delays(&mut rng, RANDOM_TIMERS, YEAR_MS);
    let later = delays(&mut rng, RANDOM_TIMERS / 4, 90 * DAY_MS);
    let (clock, timer, fired) = setup(batch.len() + later.len());
    let started = Instant::now();

    let mut deadlines = schedule(&timer, &fired, 0, &batch, 0);
    let mut ticks: Vec<u64> = deadlines.iter().map(|&(_, tick)| tick).collect();
    ticks.sort_unstable();
    // Clock readings (ns since the origin) after each advance.
    let mut readings = vec![0u64];
    let mut now_ns = 0u64;
    let end_ns = (YEAR_MS + 1) * MS;
    let mut later_scheduled = false;
    while now_ns < end_ns {
        // Log-uniform steps from 1 ns to about a day, mostly off the millisecond grid.
        let bits = rng.between(0, 46);
        let step = rng.between(1 << bits, (2 << bits) - 1).min(DAY_MS * MS);
        clock.advance(Duration::from_nanos(step));
        now_ns += step;
        readings.push(now_ns);
        // Never early: the count is exactly the timers whose tick the clock has reached.
        let now_tick = now_ns / MS;
        let reached = ticks.partition_point(|&tick| tick <= now_tick);
        assert_eq!(
            fired.count.load(Ordering::SeqCst),
            reached,
            "at {now_ns} ns"
        );
        if !later_scheduled && now_ns > 200 * DAY_MS * MS {
            deadlines.extend(schedule(&timer, &fired, batch.len(), &later, now_ns));
            ticks = deadlines.iter().map(|&(_, tick)| tick).collect();
            ticks.sort_unstable();
            later_scheduled = true;
        }
    }
    for (id, tick) in &deadlines {
        // The first reading whose tick reaches the deadline tick.
        let expected = readings[readings.partition_point(|&reading| reading / MS < *tick)];
        let at = fired.at[*id].load(Ordering::SeqCst);
        assert_eq!(at, expected, "timer {id} due at tick {tick}");
    }
    let took = started.elapsed();
    assert_eq!(timer.pending(), 0);
    eprintln!(
        "{} timers over a simulated year in {} random steps: {took:?} real time",
        deadlines.len(),
        readings.len() - 1
    );
    assert!(
        took < Duration::from_secs(30),
        "a simulated year took {took:?}"
    );
}
