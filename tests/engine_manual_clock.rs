//! Engines on a manual clock: no threads, `clock.advance(d)` drives them, so timers fire
//! exactly when the clock passes their deadline, never before, and a simulated year is fast.

#[path = "engine_support.rs"]
mod support;

use shardwheel::{Clock, Executor, Timer, TimerHandle, TimerState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{Rng, counter, get, wait_until};

fn manual(shards: usize, tick: Duration) -> (Clock, Timer) {
    let clock = Clock::manual();
    let timer = Timer::builder()
        .shards(shards)
        .tick(tick)
        .executor(Executor::Inline)
        .clock(clock.clone())
        .build()
        .expect("build timer");
    (clock, timer)
}

/// Timers of 1 to 200 ms, the clock moved 1 ms at a time: after each step exactly the timers
/// whose deadline has been reached have run.
#[test]
fn fires_exactly_when_the_clock_reaches_the_deadline() {
    let (clock, timer) = manual(2, Duration::from_millis(1));
    let start = clock.now();
    assert_eq!(clock.now(), start, "a manual clock stands still");
    let fired_at: Arc<Vec<AtomicU64>> = Arc::new((0..=200).map(|_| AtomicU64::new(0)).collect());
    for ms in 1..=200u64 {
        let (fired_at, clock_in_task) = (fired_at.clone(), clock.clone());
        timer
            .schedule(Duration::from_millis(ms), move || {
                let now = clock_in_task.now().duration_since(start).as_millis() as u64;
                fired_at[ms as usize].store(now, Ordering::SeqCst);
            })
            .unwrap();
    }
    for now in 1..=210u64 {
        clock.advance(Duration::from_millis(1));
        for ms in 1..=200u64 {
            let at = fired_at[ms as usize].load(Ordering::SeqCst);
            if ms <= now {
                assert_eq!(
                    at, ms,
                    "timer {ms} ms: fired at {at} ms (clock at {now} ms)"
                );
            } else {
                assert_eq!(at, 0, "timer {ms} ms fired early, at {now} ms");
            }
        }
    }
    let stats = timer.stats();
    assert_eq!((stats.fired, stats.pending), (200, 0));
}

/// Sub-tick deadlines round up to the tick: never early, and on the first tick at or after
/// the deadline.
#[test]
fn deadlines_round_up_to_the_tick() {
    let (clock, timer) = manual(1, Duration::from_millis(10));
    let ran = counter();
    let ran_clone = ran.clone();
    timer
        .schedule(Duration::from_millis(1), move || {
            ran_clone.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    clock.advance(Duration::from_millis(9));
    assert_eq!(get(&ran), 0);
    clock.advance(Duration::from_millis(1));
    assert_eq!(get(&ran), 1);
    // At 13 ms, a 10 ms delay is due at 23 ms: rounded up to the tick at 30 ms.
    clock.advance(Duration::from_millis(3));
    let ran_clone = ran.clone();
    timer
        .schedule(Duration::from_millis(10), move || {
            ran_clone.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    clock.advance(Duration::from_millis(16)); // 29 ms
    assert_eq!(get(&ran), 1);
    clock.advance(Duration::from_millis(1)); // 30 ms
    assert_eq!(get(&ran), 2);
}

/// Past deadlines and zero delays fire at the next advance, even by zero.
#[test]
fn past_and_zero_deadlines_fire_at_the_next_advance() {
    let (clock, timer) = manual(2, Duration::from_millis(1));
    clock.advance(Duration::from_secs(5));
    let ran = counter();
    let (a, b) = (ran.clone(), ran.clone());
    timer
        .schedule_at(clock.now() - Duration::from_secs(3), move || {
            a.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    timer
        .schedule(Duration::ZERO, move || {
            b.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    assert_eq!(get(&ran), 0, "nothing runs until the clock is driven");
    clock.advance(Duration::ZERO);
    assert_eq!(get(&ran), 2);
}

/// Cancel and reset under a manual clock: exact, deterministic.
#[test]
fn cancel_and_reset_are_exact() {
    let (clock, timer) = manual(2, Duration::from_millis(1));
    let ran = counter();
    let task = |ran: &Arc<AtomicUsize>| {
        let ran = ran.clone();
        move || {
            ran.fetch_add(1, Ordering::SeqCst);
        }
    };
    let cancelled = timer
        .schedule(Duration::from_millis(10), task(&ran))
        .unwrap();
    let later = timer
        .schedule(Duration::from_millis(10), task(&ran))
        .unwrap();
    let earlier = timer
        .schedule(Duration::from_secs(3600), task(&ran))
        .unwrap();
    clock.advance(Duration::from_millis(5));
    assert!(cancelled.cancel());
    assert!(later.reset(Duration::from_millis(20))); // due at 25 ms
    assert!(earlier.reset(Duration::from_millis(1))); // due at 6 ms
    clock.advance(Duration::from_millis(1));
    assert_eq!(get(&ran), 1);
    assert_eq!(earlier.state(), TimerState::Expired);
    clock.advance(Duration::from_millis(18)); // 24 ms
    assert_eq!(get(&ran), 1);
    assert_eq!(later.state(), TimerState::Pending);
    assert_eq!(cancelled.state(), TimerState::Cancelled);
    clock.advance(Duration::from_millis(1)); // 25 ms
    assert_eq!(get(&ran), 2);
    assert_eq!(later.state(), TimerState::Expired);
    assert!(!later.reset(Duration::ZERO));
    let stats = timer.stats();
    assert_eq!(
        (stats.fired, stats.cancelled, stats.reset, stats.pending),
        (2, 1, 2, 0)
    );
}

/// With the default pool, `advance` hands due tasks to the pool: they run soon after.
#[test]
fn pool_executor_on_a_manual_clock() {
    let clock = Clock::manual();
    let timer = Timer::builder()
        .shards(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    let ran = counter();
    for i in 1..=10u64 {
        let ran = ran.clone();
        timer
            .schedule(Duration::from_secs(i), move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    clock.advance(Duration::from_millis(4999));
    assert!(wait_until(Duration::from_secs(1), || get(&ran) == 4));
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(get(&ran), 4, "no timer runs before the clock reaches it");
    clock.advance(Duration::from_secs(10));
    assert!(wait_until(Duration::from_secs(1), || get(&ran) == 10));
}

/// Two engines on one manual clock are both driven by it.
#[test]
fn one_clock_drives_several_engines() {
    let clock = Clock::manual();
    let timers: Vec<Timer> = (0..2)
        .map(|_| {
            Timer::builder()
                .shards(1)
                .executor(Executor::Inline)
                .clock(clock.clone())
                .build()
                .unwrap()
        })
        .collect();
    let ran = counter();
    for timer in &timers {
        let ran = ran.clone();
        timer
            .schedule(Duration::from_secs(60), move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    clock.advance(Duration::from_secs(59));
    assert_eq!(get(&ran), 0);
    clock.advance(Duration::from_secs(1));
    assert_eq!(get(&ran), 2);
}

/// A year of simulated time, 1 ms tick, default six levels: timers in every level (1 ms to a
/// year), beyond the top level (3 years: overflow) and `Duration::MAX`, some cancelled and some
/// reset. The clock jumps to one tick before each deadline (nothing due has not run, nothing
/// has run early) and then onto it (it has run, at exactly that time).
#[test]
fn a_simulated_year_across_all_levels() {
    let wall = Instant::now();
    let (clock, timer) = manual(2, Duration::from_millis(1));
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

/// Resets of many timers, later (in place, no message) and earlier (relocated), across the
/// wheel's cascades: every timer runs once, at the first clock step that reaches the deadline
/// of its last successful reset (never before it); and the counters add up.
#[test]
fn lazy_and_relocating_resets_fire_at_the_last_deadline() {
    let (clock, timer) = manual(2, Duration::from_millis(1));
    let start = clock.now();
    let count = 3_000usize;
    let fired_at: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let mut rng = Rng::new(11);
    // Per timer: (deadline, set at) in ms after start.
    let mut expected = vec![(0u64, 0u64); count];
    let mut handles = Vec::with_capacity(count);
    for (id, due) in expected.iter_mut().enumerate() {
        due.0 = 1 + rng.below(5_000);
        let (fired_at, clock_in_task) = (fired_at.clone(), clock.clone());
        let handle = timer
            .schedule(Duration::from_millis(due.0), move || {
                let now = clock_in_task.now().duration_since(start).as_millis() as u64;
                assert_eq!(
                    fired_at[id].swap(now, Ordering::SeqCst),
                    0,
                    "timer {id} ran twice"
                );
            })
            .unwrap();
        handles.push(handle);
    }
    let mut stops = Vec::new();
    let mut resets = 0u64;
    let mut now = 0u64;
    while now < 12_000 {
        let step = 1 + rng.below(150);
        clock.advance(Duration::from_millis(step));
        now += step;
        stops.push(now);
        for _ in 0..200 {
            let id = rng.below(count as u64) as usize;
            // Mostly later (an idle timeout pushed back), sometimes earlier.
            let delay = if rng.below(4) == 0 {
                rng.below(40)
            } else {
                500 + rng.below(3_000)
            };
            let pending = fired_at[id].load(Ordering::SeqCst) == 0;
            let accepted = handles[id].reset(Duration::from_millis(delay));
            assert_eq!(
                accepted, pending,
                "timer {id} at {now} ms: reset said {accepted}"
            );
            if accepted {
                expected[id] = (now + delay, now);
                resets += 1;
            }
        }
    }
    clock.advance(Duration::from_secs(10));
    stops.push(now + 10_000);
    for (id, &(due, set_at)) in expected.iter().enumerate() {
        let fired = fired_at[id].load(Ordering::SeqCst);
        // The first step after the deadline was set that reaches it (a deadline of "now"
        // fires at the next step).
        let first = stops
            .iter()
            .copied()
            .find(|&stop| stop >= due && stop > set_at)
            .expect("a last step reaches every deadline");
        assert_eq!(
            fired, first,
            "timer {id} due at {due} ms (set at {set_at} ms) ran at {fired} ms"
        );
    }
    let stats = timer.stats();
    assert_eq!(stats.fired, count as u64);
    assert_eq!(stats.reset, resets);
    assert_eq!(stats.pending, 0);
}
