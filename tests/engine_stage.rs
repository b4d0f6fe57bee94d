//! Stages (`src/engine/stage.rs`): new one-shot timers reach their shard through a per-thread
//! ring. A full ring falls back to the shard's inbox; a ring outlives its thread; timers
//! cancelled before their shard adopted them end exactly once.

use shardwheel::{Clock, Executor, Timer};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn manual(clock: &Clock, shards: usize) -> Timer {
    Timer::builder()
        .shards(shards)
        .executor(Executor::Inline)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// With no shard thread to drain it, one thread stages more timers than a ring holds: the rest
/// take the inbox. Every third is cancelled (some staged, some not); the rest fire once.
#[test]
fn a_full_stage_falls_back_to_the_inbox() {
    let clock = Clock::manual();
    let timer = manual(&clock, 1);
    let runs = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..5000)
        .map(|_| {
            let runs = runs.clone();
            timer
                .schedule(Duration::from_millis(5), move || {
                    runs.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
        })
        .collect();
    let cancelled = handles
        .iter()
        .step_by(3)
        .filter(|handle| handle.cancel())
        .count();
    assert_eq!(cancelled, 1667);
    clock.advance(Duration::from_millis(10));
    assert_eq!(runs.load(Ordering::SeqCst), 5000 - 1667);
    let stats = timer.stats();
    assert_eq!(
        (stats.pending, stats.fired, stats.cancelled),
        (0, 3333, 1667)
    );
}

/// Many short-lived threads each stage timers and exit; later threads take their rings over.
/// Every timer fires once.
#[test]
fn stages_outlive_their_threads() {
    let clock = Clock::manual();
    let timer = manual(&clock, 2);
    let runs = Arc::new(AtomicUsize::new(0));
    for round in 0..50 {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (timer, runs) = (timer.clone(), runs.clone());
                std::thread::spawn(move || {
                    for _ in 0..10 {
                        let runs = runs.clone();
                        timer
                            .schedule(Duration::from_millis(1), move || {
                                runs.fetch_add(1, Ordering::SeqCst);
                            })
                            .unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        if round % 7 == 0 {
            clock.advance(Duration::from_millis(2));
        }
    }
    clock.advance(Duration::from_millis(2));
    assert_eq!(runs.load(Ordering::SeqCst), 50 * 4 * 10);
    assert_eq!(timer.stats().fired, 2000);
}

/// A thread stages timers and cancels most of them at once (a server's timeouts): with shard
/// threads running, every end is counted once and the survivors fire.
#[test]
fn cancelled_while_staged_on_a_running_engine() {
    let timer = Timer::builder().shards(2).build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut survivors = 0;
    for i in 0..20_000 {
        let runs = runs.clone();
        let handle = timer
            .schedule(Duration::from_millis(20), move || {
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        if i % 100 == 0 {
            survivors += 1;
        } else {
            assert!(handle.cancel());
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while runs.load(Ordering::SeqCst) < survivors && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(runs.load(Ordering::SeqCst), survivors);
    let stats = timer.stats();
    assert_eq!(
        (stats.pending, stats.fired, stats.cancelled),
        (0, survivors as u64, 20_000 - survivors as u64)
    );
    assert!(timer.shutdown().is_empty());
}
