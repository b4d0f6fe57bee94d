//! A year of simulated time on a manual clock, in a fraction of a second of real time: timers
//! on every wheel level (deadlines from 1 ns to 365 days, log-uniform, plus the level
//! boundaries 64^k ms and their neighbours), each checked to run exactly at its tick.
//!
//! Three ways through the year:
//! * stepping to 1 ms before each deadline tick, then 1 ms onto it: every timer must run on
//!   the step onto its tick, with `clock.now()` (read inside the task) equal to its deadline
//!   rounded up to the 1 ms tick, and none may run on the step before;
//! * random steps of any length (1 ns to a day): every timer must run on the first step whose
//!   tick reaches its deadline tick, no earlier and no later;
//! * jumping to one tick before each deadline, then onto it, with timers beyond the top level
//!   and at `Duration::MAX`, some cancelled and some reset on the way.

mod support;

use shardwheel::{Clock, Timer, TimerHandle, TimerState};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{Rng, counter, get, manual_timer};

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
    let (clock, timer) = manual_timer(2, Duration::from_millis(1));
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

/// A year of simulated time, 1 ms tick, default six levels: timers in every level (1 ms to a
/// year), beyond the top level (3 years: overflow) and `Duration::MAX`, some cancelled and some
/// reset. The clock jumps to one tick before each deadline (nothing due has not run, nothing
/// has run early) and then onto it (it has run, at exactly that time).
#[test]
fn a_simulated_year_across_all_levels() {
    let wall = Instant::now();
    let (clock, timer) = manual_timer(2, Duration::from_millis(1));
    let start = clock.now();
    let ms = |instant: Instant| instant.duration_since(start).as_millis() as u64;
    let mut rng = Rng::new(2024);
    const YEAR_MS: u64 = 365 * 24 * 3600 * 1000;
    // Delays spread over the levels: 64^level ticks and up, plus exact level boundaries.
    let mut delays: Vec<u64> = Vec::new();
    for level in 0..6u32 {
        let low = 64u64.pow(level);
        let high = (64u64.pow(level + 1)).min(YEAR_MS);
        for _ in 0..150 {
            delays.push(low + rng.below(high - low));
        }
        delays.extend([low, low + 1, low.saturating_sub(1).max(1), high - 1]);
    }
    delays.extend([YEAR_MS, YEAR_MS - 1]);
    let fired_at: Arc<Mutex<Vec<Option<u64>>>> = Arc::new(Mutex::new(vec![None; delays.len()]));
    let mut handles: Vec<TimerHandle> = Vec::new();
    for (i, &delay) in delays.iter().enumerate() {
        let (fired_at, clock_in_task) = (fired_at.clone(), clock.clone());
        let handle = timer
            .schedule(Duration::from_millis(delay), move || {
                let now = clock_in_task.now().duration_since(start).as_millis() as u64;
                let mut fired_at = fired_at.lock().unwrap();
                assert!(fired_at[i].is_none(), "timer {i} ran twice");
                fired_at[i] = Some(now);
            })
            .unwrap();
        handles.push(handle);
    }
    // Beyond the year: 3 years (past the top level of 2^36 ms) and never.
    let never = counter();
    let mut beyond = Vec::new();
    for delay in [Duration::from_secs(3 * 365 * 24 * 3600), Duration::MAX] {
        let never = never.clone();
        beyond.push(
            timer
                .schedule(delay, move || {
                    never.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap(),
        );
    }
    // Cancel every 7th, reset every 11th to a new random deadline (from now, at time 0).
    let mut deadline: Vec<Option<u64>> = delays.iter().map(|&d| Some(d)).collect();
    for i in (0..delays.len()).step_by(7) {
        assert!(handles[i].cancel());
        deadline[i] = None;
    }
    for i in (3..delays.len()).step_by(11) {
        if deadline[i].is_some() {
            let new = 1 + rng.below(YEAR_MS);
            assert!(handles[i].reset(Duration::from_millis(new)));
            deadline[i] = Some(new);
        }
    }
    let mut stops: Vec<u64> = deadline
        .iter()
        .flatten()
        .flat_map(|&d| [d - 1, d])
        .collect();
    stops.extend([YEAR_MS + 1]);
    stops.sort_unstable();
    stops.dedup();
    let mut steps = 0;
    for stop in stops {
        let now = ms(clock.now());
        if stop <= now {
            continue;
        }
        clock.advance(Duration::from_millis(stop - now));
        steps += 1;
        assert_eq!(ms(clock.now()), stop);
        let fired_at = fired_at.lock().unwrap();
        for (i, expected) in deadline.iter().enumerate() {
            match (expected, fired_at[i]) {
                (None, Some(at)) => panic!("cancelled timer {i} ran at {at} ms"),
                (None, None) => {}
                (Some(d), None) => {
                    assert!(*d > stop, "timer {i} due at {d} ms not run at {stop} ms")
                }
                (Some(d), Some(at)) => {
                    assert_eq!(at, *d, "timer {i} due at {d} ms ran at {at} ms");
                }
            }
        }
    }
    assert_eq!(get(&never), 0);
    for handle in &beyond {
        assert_eq!(handle.state(), TimerState::Pending);
    }
    let expected_fired = deadline.iter().flatten().count() as u64;
    let stats = timer.stats();
    assert_eq!(stats.fired, expected_fired);
    assert_eq!(stats.pending, 2);
    // Two more years: the 3-year timer fires (from the overflow), `Duration::MAX` never does.
    clock.advance(Duration::from_secs(2 * 365 * 24 * 3600));
    assert_eq!(get(&never), 1);
    assert_eq!(beyond[0].state(), TimerState::Expired);
    assert_eq!(beyond[1].state(), TimerState::Pending);
    assert_eq!(timer.shutdown().len(), 1);
    println!(
        "{} timers, {steps} clock steps over a simulated year in {:?}",
        delays.len() + 2,
        wall.elapsed()
    );
}
