//! Timers on a manual clock (`Clock::manual()`): nothing moves until the test calls
//! `clock.advance(d)`, and when `advance` returns every timer due by the new time has been
//! handed to run (with `Executor::Inline`, has run). So every assertion here is exact and none
//! of them sleeps. Closure timers: one-shot (deadlines, rounding, cancel, reset, lazy and
//! relocating resets), repeating (each missed-tick policy, fixed delay, reset and cancel), the
//! pool executor, one clock driving several engines.
//!
//! The same clock under the async API (sleeps, timeouts, intervals) is `manual_clock_async.rs`;
//! a simulated year across every wheel level is `manual_clock_year.rs`.

mod support;

use shardwheel::{Clock, Executor, MissedTickBehavior, Timer, TimerState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{Rng, counter, get, manual_timer, wait_until};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Times (since `origin`) at which a task ran, read from the manual clock inside the task.
#[derive(Clone)]
struct Runs {
    clock: Clock,
    origin: Instant,
    at: Arc<Mutex<Vec<Duration>>>,
}

impl Runs {
    fn new(clock: &Clock) -> Runs {
        Runs {
            clock: clock.clone(),
            origin: clock.now(),
            at: Arc::default(),
        }
    }

    fn record(&self) {
        let now = self.clock.now() - self.origin;
        self.at.lock().unwrap().push(now);
    }

    fn millis(&self) -> Vec<u64> {
        self.at
            .lock()
            .unwrap()
            .iter()
            .map(|at| at.as_millis() as u64)
            .collect()
    }

    fn exact(&self) -> Vec<Duration> {
        self.at.lock().unwrap().clone()
    }
}

/// Advances in 1 ms steps.
fn step(clock: &Clock, millis: u64) {
    for _ in 0..millis {
        clock.advance(ms(1));
    }
}

/// Timers of 1 to 200 ms, the clock moved 1 ms at a time: after each step exactly the timers
/// whose deadline has been reached have run.
#[test]
fn fires_exactly_when_the_clock_reaches_the_deadline() {
    let (clock, timer) = manual_timer(2, ms(1));
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
    let (clock, timer) = manual_timer(1, Duration::from_millis(10));
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
    let (clock, timer) = manual_timer(2, ms(1));
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
    let (clock, timer) = manual_timer(2, ms(1));
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

#[test]
fn timers_move_only_when_the_clock_advances() {
    let (clock, timer) = manual_timer(2, ms(1));
    assert!(clock.is_manual() && !Clock::system().is_manual());
    let fired = Arc::new(AtomicUsize::new(0));
    let flag = fired.clone();
    let start = clock.now();
    timer
        .schedule(ms(50), move || {
            flag.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    // Real time passes; the manual clock and the timer do not move.
    std::thread::sleep(ms(80));
    assert_eq!(clock.now(), start);
    assert_eq!(fired.load(Ordering::SeqCst), 0);
    clock.advance(ms(49));
    assert_eq!(fired.load(Ordering::SeqCst), 0);
    assert_eq!(timer.pending(), 1);
    clock.advance(ms(1));
    assert_eq!(
        fired.load(Ordering::SeqCst),
        1,
        "advance returned before the task ran"
    );
    assert_eq!(clock.now() - start, ms(50));
    assert_eq!(timer.pending(), 0);
    assert_eq!(timer.stats().fired, 1);
}

#[test]
fn advance_returns_after_every_due_timer_has_run() {
    let (clock, timer) = manual_timer(2, ms(1));
    let mut rng = Rng::new(3);
    let due: Vec<u64> = (0..2000).map(|_| rng.between(1, 300)).collect();
    let ran = Arc::new(AtomicUsize::new(0));
    for &millis in &due {
        let ran = ran.clone();
        timer
            .schedule(ms(millis), move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    for now in 1..=300u64 {
        clock.advance(ms(1));
        let expected = due.iter().filter(|&&millis| millis <= now).count();
        assert_eq!(ran.load(Ordering::SeqCst), expected, "at {now} ms");
    }
    // A second timer on the same clock is driven by the same advance.
    let other = Timer::builder()
        .clock(clock.clone())
        .executor(Executor::Inline)
        .build()
        .unwrap();
    let flag = ran.clone();
    other
        .schedule(ms(5), move || {
            flag.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    clock.advance(ms(5));
    assert_eq!(ran.load(Ordering::SeqCst), due.len() + 1);
}

#[test]
fn with_a_pool_executor_advance_hands_the_tasks_over() {
    let clock = Clock::manual();
    let timer = Timer::builder()
        .clock(clock.clone())
        .shards(1)
        .build()
        .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let flag = ran.clone();
    timer
        .schedule(ms(10), move || {
            flag.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    clock.advance(ms(9));
    assert_eq!(timer.stats().fired, 0);
    clock.advance(ms(1));
    // Handed to the pool by now; it runs there shortly.
    assert_eq!(timer.stats().fired, 1);
    assert!(wait_until(Duration::from_secs(2), || ran
        .load(Ordering::SeqCst)
        == 1));
}

#[test]
fn fixed_rate_runs_exactly_on_the_grid() {
    let (clock, timer) = manual_timer(2, ms(1));
    let runs = Runs::new(&clock);
    let record = runs.clone();
    let handle = timer
        .schedule_repeating(ms(10), MissedTickBehavior::Skip, move || record.record())
        .unwrap();
    let after = Runs::new(&clock);
    let record = after.clone();
    let delayed = timer
        .schedule_repeating_after(ms(3), ms(7), MissedTickBehavior::Burst, move || {
            record.record()
        })
        .unwrap();
    step(&clock, 200);
    assert_eq!(runs.millis(), (1..=20).map(|k| 10 * k).collect::<Vec<_>>());
    // Exactly, to the nanosecond: run k at start + k * period.
    assert_eq!(runs.exact()[19], ms(200));
    assert_eq!(
        after.millis(),
        (0..=28).map(|k| 3 + 7 * k).collect::<Vec<_>>()
    );
    assert!(handle.cancel() && delayed.cancel());
    step(&clock, 50);
    assert_eq!(runs.millis().len(), 20);
    assert_eq!(timer.pending(), 0);
}

/// A repeating timer with period 10 ms, then one advance of 35 ms (the points at 10, 20 and
/// 30 ms are all due at once), then 1 ms steps to 60 ms. Returns when each run happened.
fn one_big_advance(missed: MissedTickBehavior) -> Vec<u64> {
    let (clock, timer) = manual_timer(2, ms(1));
    let runs = Runs::new(&clock);
    let record = runs.clone();
    let _handle = timer
        .schedule_repeating(ms(10), missed, move || record.record())
        .unwrap();
    clock.advance(ms(35));
    step(&clock, 25);
    runs.millis()
}

#[test]
fn burst_runs_every_missed_point_within_the_advance() {
    assert_eq!(
        one_big_advance(MissedTickBehavior::Burst),
        [35, 35, 35, 40, 50, 60]
    );
}

#[test]
fn skip_drops_the_missed_points_and_keeps_the_grid() {
    assert_eq!(one_big_advance(MissedTickBehavior::Skip), [35, 40, 50, 60]);
}

#[test]
fn delay_restarts_the_grid_from_the_late_run() {
    assert_eq!(one_big_advance(MissedTickBehavior::Delay), [35, 45, 55]);
}

#[test]
fn fixed_delay_counts_from_the_end_of_each_run() {
    let (clock, timer) = manual_timer(2, ms(1));
    let runs = Runs::new(&clock);
    let record = runs.clone();
    let _handle = timer
        .schedule_with_fixed_delay(ms(5), ms(10), move || record.record())
        .unwrap();
    step(&clock, 40);
    assert_eq!(runs.millis(), [5, 15, 25, 35]);
    // A late run: the next one is a full delay after it, not on any grid.
    clock.advance(ms(17)); // to 57: the run due at 45 runs now
    step(&clock, 20);
    assert_eq!(runs.millis(), [5, 15, 25, 35, 57, 67, 77]);
}

#[test]
fn reset_and_cancel_of_a_repeating_timer() {
    let (clock, timer) = manual_timer(2, ms(1));
    let runs = Runs::new(&clock);
    let record = runs.clone();
    let handle = timer
        .schedule_repeating(ms(100), MissedTickBehavior::Skip, move || record.record())
        .unwrap();
    clock.advance(ms(30));
    // Bring the next run forward to 40 ms: the grid restarts there.
    assert!(handle.reset(ms(10)));
    step(&clock, 250);
    assert_eq!(runs.millis(), [40, 140, 240]);
    // Push it back: from 280 ms, the run due at 340 moves to 400.
    assert!(handle.reset_at(clock.now() + ms(120)));
    step(&clock, 200);
    assert_eq!(runs.millis(), [40, 140, 240, 400]);
    assert!(handle.cancel());
    assert_eq!(handle.state(), TimerState::Cancelled);
    step(&clock, 300);
    assert_eq!(runs.millis().len(), 4);
    assert!(!handle.reset(ms(1)), "a cancelled timer cannot be reset");
}

#[test]
fn a_task_that_cancels_its_own_timer_runs_no_more() {
    let (clock, timer) = manual_timer(2, ms(1));
    let runs = Runs::new(&clock);
    let record = runs.clone();
    let slot: Arc<Mutex<Option<shardwheel::TimerHandle>>> = Arc::default();
    let own = slot.clone();
    let handle = timer
        .schedule_repeating(ms(10), MissedTickBehavior::Burst, move || {
            record.record();
            if record.at.lock().unwrap().len() == 3 {
                assert!(own.lock().unwrap().as_ref().unwrap().cancel());
            }
        })
        .unwrap();
    *slot.lock().unwrap() = Some(handle);
    step(&clock, 100);
    assert_eq!(runs.millis(), [10, 20, 30]);
}

/// Resets of many timers, later (in place, no message) and earlier (relocated), across the
/// wheel's cascades: every timer runs once, at the first clock step that reaches the deadline
/// of its last successful reset (never before it); and the counters add up.
#[test]
fn lazy_and_relocating_resets_fire_at_the_last_deadline() {
    let (clock, timer) = manual_timer(2, ms(1));
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

/// A manual clock advanced beyond what the engine's time holds (2^64 ns, about 584 years, on a
/// 1 ns tick): a timer due later, or never, does not fire (the engine's time stops short of the
/// tick of "never"; it once reached it and ran them), and a repeating timer does not run
/// back to back at the stopped time (`advance` once never returned).
#[test]
fn time_beyond_584_years_runs_no_timer_early_and_no_repeat_forever() {
    let (clock, timer) = manual_timer(1, Duration::from_nanos(1));
    let ran = counter();
    let count = |ran: &Arc<AtomicUsize>| {
        let ran = ran.clone();
        move || {
            ran.fetch_add(1, Ordering::SeqCst);
        }
    };
    let never = timer.schedule(Duration::MAX, count(&ran)).unwrap();
    let far = clock.now() + Duration::from_secs(1 << 40);
    let beyond = timer.schedule_at(far, count(&ran)).unwrap();
    clock.advance(Duration::from_secs(600 * 365 * 86_400));
    assert_eq!(get(&ran), 0, "{:?}", timer.stats());
    assert_eq!(never.state(), TimerState::Pending);
    assert_eq!(beyond.state(), TimerState::Pending);
    // At the stopped time, a repeating timer's next run is never due at once.
    let repeats = counter();
    let repeating = timer
        .schedule_repeating(ms(1), MissedTickBehavior::Skip, count(&repeats))
        .unwrap();
    clock.advance(Duration::MAX);
    assert_eq!(get(&ran), 0, "{:?}", timer.stats());
    assert!(get(&repeats) <= 1, "{} runs", get(&repeats));
    assert!(repeating.cancel());
    assert!(never.cancel() && beyond.cancel());
}
