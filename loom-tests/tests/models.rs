//! Loom models of every protocol in which two threads touch the same engine state.
//!
//! Run with `loom-tests/run.sh` (it sets `--cfg shardwheel_loom` and the preemption bound). Each model
//! drives the shipped engine: a manual clock with one shard and inline execution drives the
//! shard by hand; the wake-up model runs the real worker thread (as a loom thread). The slot
//! reclaim model drives the shipped slot table directly (through the public API a reclaim
//! needs thousands of timers).
#![cfg(shardwheel_loom)]

use loom::sync::Arc;
use loom::sync::Notify;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use loom_tests::model;
use shardwheel::{
    Clock, Executor, InboxHook, MissedTickBehavior, QueueHook, SlotTableHook, Timer, TimerState,
};
use std::time::{Duration, Instant};

const MILLISECOND: Duration = Duration::from_millis(1);

/// A one-shard timer on a manual clock, tasks inline: the mode the models drive by hand.
fn manual_timer(clock: &Clock) -> Timer {
    Timer::builder()
        .shards(1)
        .levels(2)
        .executor(Executor::Inline)
        .clock(clock.clone())
        .build()
        .expect("valid configuration")
}

/// A one-shard timer like [`manual_timer`], with at most `max` pending timers.
fn limited_manual_timer(clock: &Clock, max: usize) -> Timer {
    Timer::builder()
        .shards(1)
        .levels(2)
        .executor(Executor::Inline)
        .clock(clock.clone())
        .max_pending(max)
        .build()
        .expect("valid configuration")
}

/// Keeps the models' intentional panics (messages with "on purpose") off stderr.
fn quiet_intentional_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("");
            if !message.contains("on purpose") {
                default(info);
            }
        }));
    });
}

/// Counts its own drops.
struct DropCounter(Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Model 1: cancel vs expiry vs reset on one timer, from three threads. Exactly one of {the task
/// ran, a cancel returned true}; never twice; a reset that returned true moves the deadline.
#[test]
fn cancel_expiry_reset() {
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let runs = Arc::new(AtomicUsize::new(0));
        let ran_at = Arc::new(std::sync::Mutex::new(None));
        let handle = {
            let (runs, ran_at, clock) = (runs.clone(), ran_at.clone(), clock.clone());
            timer
                .schedule(MILLISECOND, move || {
                    runs.fetch_add(1, Ordering::SeqCst);
                    *ran_at.lock().unwrap() = Some(clock.now());
                })
                .unwrap()
        };
        let canceller = {
            let handle = handle.clone();
            thread::spawn(move || handle.cancel())
        };
        let resetter = {
            let (handle, clock) = (handle.clone(), clock.clone());
            thread::spawn(move || {
                let before = clock.now();
                (handle.reset(10 * MILLISECOND), before)
            })
        };
        clock.advance(2 * MILLISECOND);
        let cancelled = canceller.join().unwrap();
        let (reset, reset_at) = resetter.join().unwrap();
        clock.advance(20 * MILLISECOND);
        let runs = runs.load(Ordering::SeqCst);
        assert_eq!(
            runs + usize::from(cancelled),
            1,
            "ran {runs} times, cancel returned {cancelled}"
        );
        if reset && runs == 1 {
            let ran_at = ran_at.lock().unwrap().expect("ran");
            assert!(
                ran_at >= reset_at + 10 * MILLISECOND,
                "a successful reset did not move the deadline"
            );
        }
        let expected = if cancelled {
            TimerState::Cancelled
        } else {
            TimerState::Expired
        };
        assert_eq!(handle.state(), expected);
    });
}

/// Model 2: a timer submitted while the shard's worker is going to sleep is still seen, and an
/// earlier deadline wakes a worker sleeping on a later one. Loom parks without timeouts, so a
/// lost wake-up shows as a deadlock.
#[test]
fn submit_wakes_parking_shard() {
    model(|| {
        let timer = Timer::builder()
            .shards(1)
            .levels(2)
            .executor(Executor::Inline)
            .pin_threads(false)
            .build()
            .expect("valid configuration");
        // The worker sleeps on this one (an hour away)...
        timer.schedule(Duration::from_secs(3600), || {}).unwrap();
        // ...and must wake for this one, due at once.
        let notify = Arc::new(Notify::new());
        let fired = Arc::new(AtomicUsize::new(0));
        let long_ago = Instant::now() - Duration::from_secs(1);
        {
            let (notify, fired) = (notify.clone(), fired.clone());
            timer
                .schedule_at(long_ago, move || {
                    fired.fetch_add(1, Ordering::SeqCst);
                    notify.notify();
                })
                .unwrap();
        }
        // Loom's Notify may wake spuriously: wait for the task itself.
        while fired.load(Ordering::SeqCst) == 0 {
            notify.wait();
        }
        assert_eq!(timer.shutdown().len(), 1, "the hour-long timer is returned");
    });
}

/// Model 2 (b): the inbox's own side of model 2, which goes through stages (closure timers
/// take them under loom): a consumer that drains, then parks until a far tick, against two
/// producers pushing messages due at once. Each message either took its position before the
/// consumer set PARKED, and the consumer, which counts it, finds it urgent (or still being
/// written) and stays up; or its producer's take saw PARKED, and it wakes the consumer once
/// its message is in. A lost wake-up shows as a deadlock.
#[test]
fn inbox_push_wakes_parked_consumer() {
    model(|| {
        let inbox = Arc::new(InboxHook::default());
        let consumer = {
            let inbox = inbox.clone();
            thread::spawn(move || {
                inbox.register_current_thread();
                let mut popped = 0;
                loop {
                    popped += inbox.drain();
                    if popped == 2 {
                        return;
                    }
                    inbox.park(1_000);
                }
            })
        };
        let producer = {
            let inbox = inbox.clone();
            thread::spawn(move || assert!(inbox.push(0)))
        };
        assert!(inbox.push(0));
        producer.join().unwrap();
        consumer.join().unwrap();
    });
}

/// Model 3: shutdown vs a concurrent schedule and cancel: every schedule either fails, or its
/// timer runs, is cancelled, or is returned by shutdown. None lost, none twice.
#[test]
fn shutdown_vs_schedule_and_cancel() {
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let runs = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let task = |id: usize| {
            let runs = runs.clone();
            move || {
                runs[id].fetch_add(1, Ordering::SeqCst);
            }
        };
        let early = timer.schedule(MILLISECOND, task(0)).unwrap();
        let scheduler = {
            let (timer, task) = (timer.clone(), task(1));
            thread::spawn(move || timer.schedule(MILLISECOND, task).is_ok())
        };
        let canceller = thread::spawn(move || early.cancel());
        let unfired = timer.shutdown();
        let scheduled = scheduler.join().unwrap();
        let cancelled = canceller.join().unwrap();
        for timer in unfired {
            timer.run();
        }
        let run0 = runs[0].load(Ordering::SeqCst);
        let run1 = runs[1].load(Ordering::SeqCst);
        assert_eq!(
            run0 + usize::from(cancelled),
            1,
            "first timer: returned {run0} times, cancelled {cancelled}"
        );
        assert_eq!(
            run1,
            usize::from(scheduled),
            "second timer: scheduled {scheduled}, returned {run1} times"
        );
        assert!(timer.schedule(MILLISECOND, || {}).is_err());
    });
}

/// Model 4: dropping the handle, and the engine, while the timer fires: the task and its
/// bookkeeping are freed exactly once (drop counter; loom also reports leaked `Arc`s).
#[test]
fn handle_and_engine_drop_vs_fire() {
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let drops = Arc::new(AtomicUsize::new(0));
        let guard = DropCounter(drops.clone());
        let handle = timer
            .schedule(MILLISECOND, move || {
                let _guard = guard;
            })
            .unwrap();
        let dropper = thread::spawn(move || drop(handle));
        let firer = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(2 * MILLISECOND))
        };
        drop(timer);
        dropper.join().unwrap();
        firer.join().unwrap();
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1,
            "task dropped {} times",
            drops.load(Ordering::SeqCst)
        );
    });
}

/// Model 5: max_pending accounting under concurrent schedules, a cancel and expiry: never
/// above the limit (no two schedules take the last place), back to zero.
#[test]
fn max_pending_accounting() {
    model(|| {
        let clock = Clock::manual();
        let timer = Timer::builder()
            .shards(1)
            .levels(2)
            .executor(Executor::Inline)
            .clock(clock.clone())
            .max_pending(2)
            .build()
            .unwrap();
        let first = timer.schedule(MILLISECOND, || {}).unwrap();
        let spawn_schedule = |timer: &Timer| {
            let timer = timer.clone();
            thread::spawn(move || {
                let scheduled = timer.schedule(MILLISECOND, || {}).is_ok();
                assert!(
                    timer.pending() <= 2,
                    "pending {} above the limit",
                    timer.pending()
                );
                scheduled
            })
        };
        let second = spawn_schedule(&timer);
        let third = spawn_schedule(&timer);
        let canceller = thread::spawn(move || first.cancel());
        let scheduled = usize::from(second.join().unwrap()) + usize::from(third.join().unwrap());
        let cancelled = canceller.join().unwrap();
        assert!(scheduled >= 1, "a place was free for at least one");
        assert_eq!(timer.pending(), 1 - usize::from(cancelled) + scheduled);
        clock.advance(5 * MILLISECOND);
        assert_eq!(timer.pending(), 0);
    });
}

/// Model 6: slots freed by handle drops and reused by concurrent schedules (the lock-free free
/// list): two timers never share a slot, and a stale handle never touches the new timer.
#[test]
fn slot_reuse_is_exclusive() {
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let old = timer.schedule(MILLISECOND, || {}).unwrap();
        clock.advance(2 * MILLISECOND); // fired: the slot frees when `old` drops
        let stale = old.clone();
        drop(old);
        let spawn_schedule = |timer: &Timer| {
            let timer = timer.clone();
            thread::spawn(move || timer.schedule(Duration::from_secs(1), || {}).unwrap())
        };
        let first = spawn_schedule(&timer);
        let second = spawn_schedule(&timer);
        let dropper = thread::spawn(move || drop(stale));
        let first = first.join().unwrap();
        let second = second.join().unwrap();
        dropper.join().unwrap();
        assert!(first.cancel());
        assert_eq!(
            second.state(),
            TimerState::Pending,
            "cancelling one timer touched another"
        );
        assert!(second.cancel());
    });
}

/// A waker for loom: counts wakes and notifies a waiting loom thread.
struct LoomWaker {
    woken: AtomicUsize,
    notify: Notify,
}

impl std::task::Wake for LoomWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.woken.fetch_add(1, Ordering::SeqCst);
        self.notify.notify();
    }
}

fn loom_waker() -> (std::sync::Arc<LoomWaker>, std::task::Waker) {
    let flag = std::sync::Arc::new(LoomWaker {
        woken: AtomicUsize::new(0),
        notify: Notify::new(),
    });
    (flag.clone(), std::task::Waker::from(flag))
}

/// Model 7 (async): a `Sleep` polled while its deadline passes on another thread, under a new
/// waker at its second poll: the latest waker is woken (the second poll replaces the timer, or
/// finds it fired) and no wake-up is lost (a lost one deadlocks).
#[test]
fn sleep_wakes_the_latest_waker() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let mut sleep = timer.sleep(MILLISECOND);
        let (first, first_waker) = loom_waker();
        let (second, second_waker) = loom_waker();
        let firer = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(2 * MILLISECOND))
        };
        let mut poll =
            |waker: &std::task::Waker| Pin::new(&mut sleep).poll(&mut Context::from_waker(waker));
        if poll(&first_waker).is_pending() && poll(&second_waker).is_pending() {
            while second.woken.load(Ordering::SeqCst) == 0 {
                second.notify.wait();
            }
            assert_eq!(poll(&second_waker), Poll::Ready(()));
        }
        firer.join().unwrap();
        // Extra (spurious) wake-ups are allowed; a lost one would have deadlocked above.
        let _ = first.woken.load(Ordering::SeqCst);
        assert_eq!(poll(&second_waker), Poll::Ready(()));
    });
}

/// Model 7b (async, lazy registration): a `Sleep`'s first poll finds its deadline ahead and
/// schedules its timer while another thread advances the clock past the deadline. Either the
/// poll completes, or the one waker it registered is woken: an advance whose drive ran before
/// the timer reached the shard must be seen by the poll (a lost wake-up deadlocks).
#[test]
fn sleep_first_poll_registers_without_losing_the_wake_up() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let mut sleep = timer.sleep(MILLISECOND);
        let (woken, waker) = loom_waker();
        let firer = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(2 * MILLISECOND))
        };
        let mut context = Context::from_waker(&waker);
        if Pin::new(&mut sleep).poll(&mut context).is_pending() {
            while woken.woken.load(Ordering::SeqCst) == 0 {
                woken.notify.wait();
            }
            assert_eq!(Pin::new(&mut sleep).poll(&mut context), Poll::Ready(()));
        }
        firer.join().unwrap();
    });
}

/// Model 7c (async): an armed `Sleep` dropped (which cancels its timer and lets go of its
/// handle in one compare-and-swap) while another thread advances the clock past its deadline:
/// the timer ends exactly once (fired or cancelled, counted once), its `max_pending` place is
/// given back, and a new sleep then schedules and completes.
#[test]
fn sleep_drop_vs_fire() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Context;
    model(|| {
        let clock = Clock::manual();
        let timer = limited_manual_timer(&clock, 1);
        let mut sleep = timer.sleep(MILLISECOND);
        let (_woken, waker) = loom_waker();
        let mut context = Context::from_waker(&waker);
        assert!(Pin::new(&mut sleep).poll(&mut context).is_pending());
        let firer = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(2 * MILLISECOND))
        };
        drop(sleep);
        firer.join().unwrap();
        let stats = timer.stats();
        assert_eq!(
            (
                stats.scheduled,
                stats.fired + stats.cancelled,
                stats.pending
            ),
            (1, 1, 0),
            "the timer did not end exactly once: {stats:?}"
        );
        let mut again = timer
            .try_sleep_until(clock.now() + MILLISECOND)
            .expect("the dropped sleep's place was given back");
        clock.advance(MILLISECOND);
        assert!(Pin::new(&mut again).poll(&mut context).is_ready());
    });
}

/// Model 7d (async): an armed `Sleep` is reset to a later deadline (which leaves its timer
/// where it is: see `Sleep::reset`) while another thread advances the clock past the timer's
/// deadline but not the new one. The sleep must not complete before the new deadline, and must
/// complete at it: the poll after the timer fired schedules one for the new deadline.
#[test]
fn sleep_moved_later_vs_fire() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let start = clock.now();
        let mut sleep = timer.sleep(MILLISECOND);
        let (_woken, waker) = loom_waker();
        let mut context = Context::from_waker(&waker);
        assert!(Pin::new(&mut sleep).poll(&mut context).is_pending());
        let firer = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(2 * MILLISECOND))
        };
        Pin::new(&mut sleep).reset(start + 3 * MILLISECOND);
        firer.join().unwrap();
        assert!(
            Pin::new(&mut sleep).poll(&mut context).is_pending(),
            "completed at 2 ms, before its deadline of 3 ms"
        );
        clock.advance(MILLISECOND);
        assert_eq!(Pin::new(&mut sleep).poll(&mut context), Poll::Ready(()));
        let stats = timer.stats();
        assert_eq!(
            (
                stats.pending,
                stats.scheduled,
                stats.fired + stats.cancelled
            ),
            (0, 2, 2),
            "every timer ended once: {stats:?}"
        );
    });
}

/// Model 8: a shard reclaims its slot table (`try_reclaim`: walk the free list, seal, empty,
/// give the pages back) while a user thread frees the last slot and allocates. Every outcome
/// must leave two distinct, pending timers, and no stale (index, generation) may touch them:
/// a reclaim must not commit while a slot is being freed or popped, a page given back must
/// not erase a new timer, and fresh generations must rise above the old ones.
#[test]
fn slot_reclaim_vs_free_and_allocate() {
    model(|| {
        let table = Arc::new(SlotTableHook::default());
        let mut old = Vec::new();
        for _ in 0..2 {
            let (index, generation) = table.allocate().unwrap();
            table.begin(index, generation);
            assert!(table.cancel(index, generation));
            table.let_go(index);
            old.push((index, generation));
        }
        // The first is free; the second's last handle is still held, by the user thread.
        table.drop_handle(old[0].0);
        let user = {
            let (table, held) = (table.clone(), old[1].0);
            thread::spawn(move || {
                table.drop_handle(held);
                let (index, generation) = table.allocate().unwrap();
                table.begin(index, generation);
                (index, generation)
            })
        };
        // The shard's side. Loom 0.7 finds a race between a load and a later write only if
        // some execution runs the write first (without this yield, it never explored a
        // reclaim that succeeds): yielding lets the user thread go first.
        thread::yield_now();
        let reclaimed = table.try_reclaim();
        let (index, generation) = table.allocate().unwrap();
        table.begin(index, generation);
        let shard = (index, generation);
        let user = user.join().unwrap();
        assert_ne!(user.0, shard.0, "two timers got slot {}", user.0);
        for (who, timer) in [("user", user), ("shard", shard)] {
            assert!(
                table.is_pending(timer.0, timer.1),
                "the {who}'s new timer {timer:?} is not pending (reclaimed: {reclaimed})"
            );
        }
        for stale in old {
            assert!(
                !table.cancel(stale.0, stale.1),
                "stale {stale:?} cancelled a new timer (reclaimed: {reclaimed})"
            );
        }
        for timer in [user, shard] {
            assert!(table.cancel(timer.0, timer.1));
        }
    });
}

/// A compaction (`engine/slot/compact.rs`) moving a pending timer against a handle's lazy
/// reset of it: either the move copies the reset's deadline, or the reset sees the move (its
/// deadline lock, then 0) and resets the timer's new slot. The reset succeeds, and the timer
/// never fires before the deadline it set.
#[test]
fn compaction_move_vs_lazy_reset() {
    model(|| {
        let table = Arc::new(SlotTableHook::default());
        // A freed slot (on the list), then a pending timer due at tick 1, held by the shard.
        let (free, free_generation) = table.allocate().unwrap();
        table.begin(free, free_generation);
        assert!(table.cancel(free, free_generation));
        table.let_go(free);
        table.drop_handle(free);
        let (live, generation) = table.allocate().unwrap();
        table.begin(live, generation);
        let user = {
            let table = table.clone();
            thread::spawn(move || table.reset_lazy(live, generation, 5))
        };
        let moves = table.compact();
        let reset = user.join().unwrap();
        assert!(
            reset,
            "the reset of a pending timer failed (moves {moves:?})"
        );
        let now = table.current(live);
        assert_eq!(
            table.fire(now, 4),
            Err(5),
            "the timer (moves {moves:?}) is not due at 5, where the reset put it"
        );
        assert_eq!(table.fire(now, 5), Ok(()));
        table.drop_handle(live);
    });
}

/// A compaction against the last handle of an ended timer going (its slot freed before,
/// during or after the survey: onto the list, into the stash, or given up) and a new
/// allocation: the new timer never gets a retired slot or one in use, the pending timer is
/// moved whole, and once everything is let go of the table can be reclaimed (every count of
/// the compaction settles).
#[test]
fn compaction_vs_free_and_allocate() {
    model(|| {
        let table = Arc::new(SlotTableHook::default());
        let mut timers = Vec::new();
        for _ in 0..3 {
            let (index, generation) = table.allocate().unwrap();
            table.begin(index, generation);
            timers.push((index, generation));
        }
        // Timer 0 is free, timer 1 ended with the user's handle left, timer 2 is pending.
        for &(index, generation) in &timers[..2] {
            assert!(table.cancel(index, generation));
            table.let_go(index);
        }
        table.drop_handle(timers[0].0);
        let user = {
            let (table, ended) = (table.clone(), timers[1].0);
            thread::spawn(move || {
                table.drop_handle(ended);
                let (index, generation) = table.allocate().unwrap();
                table.begin(index, generation);
                (index, generation)
            })
        };
        thread::yield_now();
        let moves = table.compact();
        let new = user.join().unwrap();
        let pending = timers[2];
        assert!(
            table.is_pending(new.0, new.1),
            "the new timer {new:?} is not pending (moves {moves:?})"
        );
        assert!(
            table.is_pending(pending.0, pending.1),
            "the pending timer {pending:?} was lost (moves {moves:?})"
        );
        assert_ne!(
            table.current(new.0),
            table.current(pending.0),
            "two timers in one slot (moves {moves:?})"
        );
        for (index, generation) in [new, pending] {
            assert!(table.cancel(index, generation));
            table.let_go(table.current(index));
            table.drop_handle(index);
        }
        assert!(
            table.try_reclaim(),
            "every slot is free, yet the table cannot be reclaimed (moves {moves:?})"
        );
    });
}

/// A producer's spare slots against the shard's reclaim (`engine/slot/spares.rs`): the
/// producer's first timer was retracted into its spares; the producer then takes a slot for
/// its next timer (the spare, or one from the free list if the shard flushed it there) while
/// the shard flushes the spares and tries to reclaim the table, then takes a slot of its own.
/// No slot may be handed out twice, and no stale handle may reach a new timer.
#[test]
fn spare_slots_vs_reclaim() {
    model(|| {
        let table = Arc::new(SlotTableHook::default());
        let (index, generation) = table.allocate().unwrap();
        table.begin_staged(index, generation);
        assert!(table.retract(index, generation));
        let old = (index, generation);
        let producer = {
            let table = table.clone();
            thread::spawn(move || {
                let (index, generation) = table.take_spare().or_else(|| table.allocate()).unwrap();
                table.begin_staged(index, generation);
                (index, generation)
            })
        };
        // As in `slot_reclaim_vs_free_and_allocate`: let the other thread go first sometimes.
        thread::yield_now();
        let reclaimed = table.reclaim_with_spares();
        let (index, generation) = table.allocate().unwrap();
        table.begin(index, generation);
        let shard = (index, generation);
        let producer = producer.join().unwrap();
        assert_ne!(producer.0, shard.0, "two timers got slot {}", shard.0);
        for (who, timer) in [("producer", producer), ("shard", shard)] {
            assert!(
                table.is_pending(timer.0, timer.1),
                "the {who}'s timer {timer:?} is not pending (reclaimed: {reclaimed})"
            );
        }
        assert!(
            !table.cancel(old.0, old.1),
            "stale {old:?} cancelled a new timer (reclaimed: {reclaimed})"
        );
    });
}

/// What a task that shuts the engine down from inside saw: it ran, and ran every timer its
/// `shutdown()` returned.
struct ShutdownInside {
    /// Runs of the task that calls `shutdown()` (it must run exactly once: by the engine, or
    /// by whoever's `shutdown()` returned it).
    ran: AtomicUsize,
    /// Runs of the hour-long timer (returned by exactly one `shutdown()`, then run).
    hour: AtomicUsize,
    /// Notified when the task is done.
    done: Notify,
}

/// Schedules the hour-long timer and a timer due at `due` whose task calls `shutdown()` on a
/// clone of `timer` and runs what it returns.
fn schedule_shutdown_inside(timer: &Timer, due: Instant) -> Arc<ShutdownInside> {
    let seen = Arc::new(ShutdownInside {
        ran: AtomicUsize::new(0),
        hour: AtomicUsize::new(0),
        done: Notify::new(),
    });
    {
        let seen = seen.clone();
        timer
            .schedule(Duration::from_secs(3600), move || {
                seen.hour.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    {
        let (seen, clone) = (seen.clone(), timer.clone());
        timer
            .schedule_at(due, move || {
                for unfired in clone.shutdown() {
                    unfired.run();
                }
                seen.ran.fetch_add(1, Ordering::SeqCst);
                seen.done.notify();
            })
            .unwrap();
    }
    seen
}

/// Runs what `shutdown()` returned, waits until the task that shuts down from inside is done
/// (it may still be running on another thread when its shutdown won), and checks that no timer
/// was lost or run twice.
fn check_shutdown_inside(unfired: Vec<shardwheel::UnfiredTimer>, seen: &ShutdownInside) {
    for unfired in unfired {
        unfired.run();
    }
    // Loom's Notify may wake spuriously: wait for the count itself.
    while seen.ran.load(Ordering::SeqCst) == 0 {
        seen.done.wait();
    }
    assert_eq!(seen.ran.load(Ordering::SeqCst), 1, "the task ran twice");
    assert_eq!(
        seen.hour.load(Ordering::SeqCst),
        1,
        "the hour-long timer was returned {} times",
        seen.hour.load(Ordering::SeqCst)
    );
}

/// Model 9: `shutdown()` from inside a task running inline on the shard's own worker thread,
/// racing a `shutdown()` from the user's thread: neither deadlocks (the worker must not join
/// itself), the pending timer is returned exactly once, and the task runs exactly once.
#[test]
fn shutdown_inside_an_inline_task() {
    model(|| {
        let timer = Timer::builder()
            .shards(1)
            .levels(2)
            .executor(Executor::Inline)
            .pin_threads(false)
            .build()
            .expect("valid configuration");
        // Due at once (the worker reads the real time; loom parks without timeouts).
        let seen = schedule_shutdown_inside(&timer, Instant::now() - Duration::from_secs(1));
        let unfired = timer.shutdown();
        check_shutdown_inside(unfired, &seen);
    });
}

/// Model 10: `shutdown()` from inside a task run off the shard's thread while the shard is
/// being driven (as a pool thread runs tasks; under loom the pool is modelled by a manual
/// clock's `advance` on another thread, which runs the turn's tasks after letting go of the
/// shard), racing a `shutdown()` from the user's thread: no deadlock, the pending timer is
/// returned exactly once, and the task runs exactly once.
#[test]
fn shutdown_inside_a_task_off_the_shard_thread() {
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let seen = schedule_shutdown_inside(&timer, clock.now() + MILLISECOND);
        let driver = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(2 * MILLISECOND))
        };
        let unfired = timer.shutdown();
        driver.join().unwrap();
        check_shutdown_inside(unfired, &seen);
    });
}

/// Model 9 (a): a repeating timer's life against a cancel and a reset from two threads: its
/// run (which panics, ending the timer) may be in progress when either lands, the reset may be
/// deferred to the run's end, and the `Rearm`, `Reset` and `Cancel` messages reach the shard
/// in any order. The timer's end is counted exactly once (`pending()`, `stats()`, the
/// `max_pending` place), its task runs at most once and is dropped exactly once.
#[test]
fn repeating_run_vs_cancel_and_reset() {
    quiet_intentional_panics();
    model(|| {
        let clock = Clock::manual();
        let timer = limited_manual_timer(&clock, 1);
        let runs = Arc::new(AtomicUsize::new(0));
        let drops = Arc::new(AtomicUsize::new(0));
        let handle = {
            let (runs, guard) = (runs.clone(), DropCounter(drops.clone()));
            timer
                .schedule_repeating(MILLISECOND, MissedTickBehavior::Skip, move || {
                    let _guard = &guard;
                    runs.fetch_add(1, Ordering::SeqCst);
                    panic!("on purpose: the run ends the timer");
                })
                .unwrap()
        };
        let canceller = {
            let handle = handle.clone();
            thread::spawn(move || handle.cancel())
        };
        let resetter = {
            let handle = handle.clone();
            thread::spawn(move || handle.reset(5 * MILLISECOND))
        };
        clock.advance(MILLISECOND);
        let cancelled = canceller.join().unwrap();
        resetter.join().unwrap();
        clock.advance(20 * MILLISECOND);
        let runs = runs.load(Ordering::SeqCst);
        assert!(runs <= 1, "ran {runs} times");
        if !cancelled {
            assert_eq!(runs, 1, "neither cancelled nor run");
        }
        assert_eq!(drops.load(Ordering::SeqCst), 1, "task not dropped once");
        let stats = timer.stats();
        assert_eq!(
            (stats.pending, stats.fired, stats.cancelled),
            (0, u64::from(!cancelled), u64::from(cancelled)),
            "cancelled {cancelled}, runs {runs}: {stats:?}"
        );
        assert_eq!(timer.pending(), 0, "cancelled {cancelled}, runs {runs}");
        let expected = if cancelled {
            TimerState::Cancelled
        } else {
            TimerState::Expired
        };
        assert_eq!(handle.state(), expected);
        let again = timer.schedule(MILLISECOND, || {});
        assert!(again.is_ok(), "the place was not given back");
        assert!(timer.schedule(MILLISECOND, || {}).is_err(), "two places");
    });
}

/// Model 10 (a): shutdown while a repeating timer's run is in progress on another thread, and a
/// cancel from a third: the timer ends once, by the cancel, by shutdown's sweep (returned
/// unfired) or by the run's late hand-back, and its task is dropped exactly once.
#[test]
fn repeating_run_vs_shutdown_and_cancel() {
    model(|| {
        let clock = Clock::manual();
        let timer = limited_manual_timer(&clock, 1);
        let drops = Arc::new(AtomicUsize::new(0));
        let handle = {
            let guard = DropCounter(drops.clone());
            timer
                .schedule_repeating(MILLISECOND, MissedTickBehavior::Skip, move || {
                    let _guard = &guard;
                })
                .unwrap()
        };
        let runner = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(MILLISECOND))
        };
        let canceller = {
            let handle = handle.clone();
            thread::spawn(move || handle.cancel())
        };
        let unfired = timer.shutdown();
        runner.join().unwrap();
        let cancelled = canceller.join().unwrap();
        let returned = unfired.len();
        drop(unfired);
        assert!(
            returned + usize::from(cancelled) <= 1,
            "returned {returned}, cancelled {cancelled}"
        );
        assert_eq!(drops.load(Ordering::SeqCst), 1, "task not dropped once");
        let stats = timer.stats();
        assert_eq!(
            (stats.pending, stats.fired, stats.cancelled),
            (0, 0, 1),
            "returned {returned}, cancelled {cancelled}: {stats:?}"
        );
        assert_eq!(timer.pending(), 0);
        assert_eq!(handle.state(), TimerState::Cancelled);
    });
}

/// Model 11 (b): a one-shot timer's deadline moved earlier (a `Relocate` message) while the
/// shard expires it at its old deadline (the message may arrive after it fired): it runs
/// exactly once, never before a successful reset's deadline; its slot, freed and reused,
/// serves a new timer the stale message cannot touch.
#[test]
fn relocate_vs_expiry() {
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let runs = Arc::new(AtomicUsize::new(0));
        let ran_at = Arc::new(std::sync::Mutex::new(None));
        let handle = {
            let (runs, ran_at, clock) = (runs.clone(), ran_at.clone(), clock.clone());
            timer
                .schedule(2 * MILLISECOND, move || {
                    runs.fetch_add(1, Ordering::SeqCst);
                    *ran_at.lock().unwrap() = Some(clock.now());
                })
                .unwrap()
        };
        // An instant, not a delay: the manual clock is no loom object, so the resetter may
        // run only once the clock has moved.
        let reset_to = clock.now() + MILLISECOND;
        let resetter = thread::spawn(move || {
            let reset = handle.reset_at(reset_to);
            drop(handle);
            reset
        });
        clock.advance(2 * MILLISECOND);
        let reset = resetter.join().unwrap();
        clock.advance(2 * MILLISECOND);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "reset {reset}");
        if reset {
            let ran_at = ran_at.lock().unwrap().expect("ran");
            assert!(
                ran_at >= reset_to,
                "ran before a successful reset's deadline"
            );
        }
        assert_a_new_timer_fires(&timer, &clock, "the reused slot's timer");
        let stats = timer.stats();
        assert_eq!((stats.pending, stats.fired), (0, 2), "{stats:?}");
    });
}

/// Schedules a timer 1 ms ahead, advances `clock` past it and asserts that it ran once: the
/// shard still works (and a reused slot serves a new timer).
fn assert_a_new_timer_fires(timer: &Timer, clock: &Clock, what: &str) {
    let ran = Arc::new(AtomicUsize::new(0));
    {
        let ran = ran.clone();
        timer
            .schedule(MILLISECOND, move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    clock.advance(2 * MILLISECOND);
    assert_eq!(ran.load(Ordering::SeqCst), 1, "{what}");
}

/// Model 12 (c): a repeating timer cancelled during its run by a thread that is descheduled
/// between its state change and its push: the run's `Rearm` ends the timer, the idle shard
/// gives its entry table back (under loom it keeps none), and only then does the `Cancel`
/// arrive. The shard must check it against the slot, not index the empty table, and go on
/// working; the timer's end is counted once.
#[test]
fn late_cancel_vs_entry_table_release() {
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let drops = Arc::new(AtomicUsize::new(0));
        let handle = {
            let guard = DropCounter(drops.clone());
            timer
                .schedule_repeating(MILLISECOND, MissedTickBehavior::Skip, move || {
                    let _guard = &guard;
                })
                .unwrap()
        };
        let canceller = thread::spawn(move || handle.cancel());
        clock.advance(MILLISECOND); // The run.
        clock.advance(MILLISECOND); // Idle (if the run ended it): release planned.
        clock.advance(30 * MILLISECOND); // The entry table is given back.
        assert!(canceller.join().unwrap(), "a repeating timer stays pending");
        clock.advance(MILLISECOND); // A late Cancel is applied here.
        assert_eq!(drops.load(Ordering::SeqCst), 1, "task not dropped once");
        assert_a_new_timer_fires(&timer, &clock, "the shard stopped working");
        let stats = timer.stats();
        assert_eq!(
            (stats.pending, stats.fired, stats.cancelled),
            (0, 1, 1),
            "{stats:?}"
        );
    });
}

/// Model 16: a staged timer cancelled from another thread while its shard adopts it (the
/// cancel needs no message only if the shard has not adopted it yet). Exactly one of {the task
/// ran, the cancel returned true}; its task is dropped once; the end is counted once; the
/// slot serves a new timer afterwards.
#[test]
fn staged_cancel_vs_adoption() {
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let runs = Arc::new(AtomicUsize::new(0));
        let drops = Arc::new(AtomicUsize::new(0));
        let handle = {
            let (runs, guard) = (runs.clone(), DropCounter(drops.clone()));
            timer
                .schedule(2 * MILLISECOND, move || {
                    let _guard = &guard;
                    runs.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
        };
        let canceller = thread::spawn(move || handle.cancel());
        // Adopts the staged timer (it is not due yet).
        clock.advance(MILLISECOND);
        let cancelled = canceller.join().unwrap();
        clock.advance(2 * MILLISECOND);
        let ran = runs.load(Ordering::SeqCst);
        assert_eq!(
            ran + usize::from(cancelled),
            1,
            "ran {ran} times, cancelled {cancelled}"
        );
        assert_eq!(drops.load(Ordering::SeqCst), 1, "task not dropped once");
        let stats = timer.stats();
        assert_eq!(
            (stats.pending, stats.fired + stats.cancelled),
            (0, 1),
            "{stats:?}"
        );
        assert_a_new_timer_fires(&timer, &clock, "the slot was not given back");
    });
}

/// Model 17: a thread's stage outlives the thread: a timer it staged still fires, and another
/// thread may take the stage over (publishing after the first thread's cells, never over them)
/// while the shard drains it.
#[test]
fn staged_timers_survive_their_thread() {
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let runs = Arc::new(AtomicUsize::new(0));
        let schedule = |timer: &Timer, runs: &Arc<AtomicUsize>| {
            let runs = runs.clone();
            timer
                .schedule(MILLISECOND, move || {
                    runs.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
        };
        // Nothing orders the two threads but the stage itself: the second takes the first's
        // stage over only if the first has exited.
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (timer, runs) = (timer.clone(), runs.clone());
                thread::spawn(move || schedule(&timer, &runs))
            })
            .collect();
        clock.advance(2 * MILLISECOND);
        for thread in threads {
            thread.join().unwrap();
        }
        clock.advance(2 * MILLISECOND);
        assert_eq!(runs.load(Ordering::SeqCst), 2, "a staged timer was lost");
        assert_eq!(timer.stats().fired, 2);
    });
}

/// Model 18: a `Sleep` dropped on the thread that armed it while its shard adopts its staged
/// timer: the sleep retracts the timer (takes its task back, frees the slot) or, if the shard
/// adopted it first, cancels it the ordinary way. Either way the timer's task (a clone of the
/// waker) is dropped exactly once, the cancel counted once, and the slot serves a new timer.
#[test]
fn sleep_retract_vs_adoption() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Context;
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let (woken, waker) = loom_waker();
        {
            let mut sleep = timer.sleep(5 * MILLISECOND);
            let mut context = Context::from_waker(&waker);
            assert!(Pin::new(&mut sleep).poll(&mut context).is_pending());
            let adopter = {
                let clock = clock.clone();
                thread::spawn(move || clock.advance(MILLISECOND))
            };
            drop(sleep);
            adopter.join().unwrap();
        }
        // Applies the `Cancel` message, if the shard had adopted the timer.
        clock.advance(MILLISECOND);
        drop(waker);
        assert_eq!(
            woken.woken.load(Ordering::SeqCst),
            0,
            "a cancelled sleep woke"
        );
        assert_eq!(
            std::sync::Arc::strong_count(&woken),
            1,
            "the timer's waker clone was not dropped once"
        );
        let stats = timer.stats();
        assert_eq!(
            (stats.pending, stats.fired, stats.cancelled),
            (0, 0, 1),
            "{stats:?}"
        );
        assert_a_new_timer_fires(&timer, &clock, "the slot was not given back");
    });
}

/// Model 19: a producer whose stage fills up consumes the cells at its head that it retracted
/// itself (`Stage::reap`) while the shard drains the same stage: the role is taken by one of
/// them at a time, retracted cells are skipped, and every timer still staged is left for the
/// shard, which fires it once. (Under loom a stage holds 4 cells and fills up at 3.)
#[test]
fn reap_vs_drain() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Context;
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let (_, waker) = loom_waker();
        let mut context = Context::from_waker(&waker);
        for _ in 0..2 {
            let mut sleep = timer.sleep(5 * MILLISECOND);
            assert!(Pin::new(&mut sleep).poll(&mut context).is_pending());
            drop(sleep); // Retracted: its cell stays until someone consumes it.
        }
        let drainer = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(MILLISECOND))
        };
        let runs = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let runs = runs.clone();
            timer
                .schedule(MILLISECOND, move || {
                    runs.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
        }
        drainer.join().unwrap();
        clock.advance(2 * MILLISECOND);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "a staged timer was lost or ran twice"
        );
        let stats = timer.stats();
        assert_eq!(
            (stats.pending, stats.fired, stats.cancelled),
            (0, 2, 2),
            "{stats:?}"
        );
    });
}

/// Model 20: model 3 with a repeating timer as the racing schedule, which takes the inbox
/// (under loom one-shot closure timers take their thread's stage): a schedule message that
/// races shutdown fails, or its timer is returned; never lost, never twice.
#[test]
fn shutdown_vs_repeating_schedule() {
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let returned = Arc::new(AtomicUsize::new(0));
        let scheduler = spawn_schedule_counted(&timer, &returned, 1);
        let unfired = timer.shutdown();
        let scheduled = scheduler.join().unwrap();
        let count = unfired.len();
        for timer in unfired {
            timer.run();
        }
        assert_eq!(
            (count, returned.load(Ordering::SeqCst)),
            (usize::from(scheduled), usize::from(scheduled)),
            "scheduled {scheduled}: returned {count}"
        );
    });
}

/// Schedules a repeating timer (so through the inbox, see model 20) whose runs add `add` to
/// `returned`; true iff it was scheduled.
fn schedule_counted(timer: &Timer, returned: &Arc<AtomicUsize>, add: usize) -> bool {
    let returned = returned.clone();
    timer
        .schedule_repeating(MILLISECOND, MissedTickBehavior::Skip, move || {
            returned.fetch_add(add, Ordering::SeqCst);
        })
        .is_ok()
}

/// [`schedule_counted`] on a new thread.
fn spawn_schedule_counted(
    timer: &Timer,
    returned: &Arc<AtomicUsize>,
    add: usize,
) -> thread::JoinHandle<bool> {
    let (timer, returned) = (timer.clone(), returned.clone());
    thread::spawn(move || schedule_counted(&timer, &returned, add))
}

/// Model 20 with two schedule messages: one pushed while the other, which took the queue
/// position before it, is still being written, then shutdown. The message that found the
/// inbox open was delivered: shutdown's last drain must wait for the one in front of it and
/// apply both, not leave the second to the first's submitter (which, finding the drain over,
/// discards what it finds). Each timer is refused or returned, once.
#[test]
fn shutdown_vs_two_queued_schedules() {
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let returned = Arc::new(AtomicUsize::new(0));
        let scheduler = spawn_schedule_counted(&timer, &returned, 1);
        let second = schedule_counted(&timer, &returned, 10);
        let unfired = timer.shutdown();
        let first = scheduler.join().unwrap();
        for timer in unfired {
            timer.run();
        }
        assert_eq!(
            returned.load(Ordering::SeqCst),
            usize::from(first) + 10 * usize::from(second),
            "scheduled: first {first}, second {second} (returned: ones and tens)"
        );
    });
}

/// Model 22: a `Sleep` dropped right after it was armed takes its cell back
/// (`Stage::rewind`) while the shard drains the stage (twice), and the next sleep of the
/// thread reuses the cell: the shard never reads a cell the producer rewinds and rewrites, and
/// never passes one it has not read. The second sleep's timer fires (its waker is woken) once,
/// the first one's never, and each timer's waker clone is dropped once.
#[test]
fn rewind_vs_drain() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Context;
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let (woken, waker) = loom_waker();
        let mut context = Context::from_waker(&waker);
        let mut first = timer.sleep(5 * MILLISECOND);
        assert!(Pin::new(&mut first).poll(&mut context).is_pending());
        let drainer = {
            let clock = clock.clone();
            thread::spawn(move || {
                clock.advance(MILLISECOND);
                clock.advance(MILLISECOND);
            })
        };
        drop(first); // Retracted, and its cell taken back unless the shard may have seen it.
        let mut second = timer.sleep(5 * MILLISECOND);
        assert!(Pin::new(&mut second).poll(&mut context).is_pending());
        drainer.join().unwrap();
        clock.advance(10 * MILLISECOND);
        assert_eq!(
            woken.woken.load(Ordering::SeqCst),
            1,
            "the second sleep's timer was lost, or a timer fired twice"
        );
        assert!(Pin::new(&mut second).poll(&mut context).is_ready());
        drop(second);
        drop(waker);
        assert_eq!(
            std::sync::Arc::strong_count(&woken),
            1,
            "a timer's waker clone was not dropped once"
        );
        let stats = timer.stats();
        assert_eq!(
            (stats.pending, stats.fired, stats.cancelled),
            (0, 1, 1),
            "{stats:?}"
        );
    });
}

/// Model 23: the shard frees the slots of two cancelled timers into its chain (`Freed`) and
/// pushes the chain onto the free list in one exchange, while another thread schedules (pops
/// the list) and the main thread drops the last handle of a fired timer (pushes onto it): no
/// slot is handed out twice (each of the four timers scheduled afterwards is pending, and
/// cancelling one leaves the others pending).
#[test]
fn freed_chain_vs_allocate() {
    model(|| {
        let clock = Clock::manual();
        let timer = manual_timer(&clock);
        let fired = timer.schedule(MILLISECOND, || {}).unwrap();
        let first = timer.schedule(Duration::from_secs(1), || {}).unwrap();
        let second = timer.schedule(Duration::from_secs(1), || {}).unwrap();
        clock.advance(2 * MILLISECOND); // `fired` fired; the shard holds the other two
        assert!(first.cancel());
        assert!(second.cancel());
        drop((first, second)); // Their slots are freed by the shard's drain, into its chain.
        let drainer = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(MILLISECOND))
        };
        let scheduler = {
            let timer = timer.clone();
            thread::spawn(move || timer.schedule(Duration::from_secs(1), || {}).unwrap())
        };
        drop(fired); // Its slot goes onto the list by itself.
        drainer.join().unwrap();
        let mut timers = vec![scheduler.join().unwrap()];
        for _ in 0..3 {
            timers.push(timer.schedule(Duration::from_secs(1), || {}).unwrap());
        }
        clock.advance(MILLISECOND);
        for (cancelled, handle) in timers.iter().enumerate() {
            assert!(handle.cancel(), "timer {cancelled} was not pending");
            for (other, handle) in timers.iter().enumerate().skip(cancelled + 1) {
                assert_eq!(
                    handle.state(),
                    TimerState::Pending,
                    "cancelling timer {cancelled} touched timer {other}: a slot handed out twice"
                );
            }
        }
    });
}

/// The inbox's message queue (blocks of two cells under loom): two producers push two values
/// each while the consumer pops and hands back the blocks it has read through, which the
/// producers then fill again. Every value comes out once, each producer's in its order, and no
/// block is written while handed back or read before its cell is written (loom's `UnsafeCell`
/// checks).
#[test]
fn queue_blocks_handed_back() {
    model(|| {
        let queue = Arc::new(QueueHook::default());
        let producers: Vec<_> = (0..2u64)
            .map(|producer| {
                let queue = queue.clone();
                thread::spawn(move || {
                    for value in 0..2 {
                        queue.push(producer * 10 + value);
                    }
                })
            })
            .collect();
        let mut popped = queue.pop_ready();
        popped.extend(queue.pop_ready());
        for producer in producers {
            producer.join().unwrap();
        }
        popped.extend(queue.pop_ready());
        queue.push(99); // Into a block handed back, if one was.
        popped.extend(queue.pop_ready());
        for producer in 0..2 {
            let own: Vec<u64> = popped
                .iter()
                .copied()
                .filter(|value| value / 10 == producer)
                .collect();
            assert_eq!(own, [producer * 10, producer * 10 + 1], "popped {popped:?}");
        }
        assert_eq!(popped.len(), 5, "popped {popped:?}");
    });
}

/// The sleeps of an owned timer keep its engine alive on striped counts (`engine/lease.rs`).
/// Two threads each take a sleep, let go of the timer and drop the sleep, while the main thread
/// drops the timer. Under loom the first thread to count has its own stripe and the other
/// counts on the shared counters, in either order. The engine must be dropped exactly once,
/// after the last sleep (loom reports a leaked `Arc`, one dropped twice, or a read of freed
/// memory). Leases dropped on another thread than their own: the unit tests of `lease.rs`.
#[test]
fn owned_sleeps_outlive_their_timer() {
    model(|| {
        let clock = Clock::manual();
        let timer = Timer::builder()
            .shards(2)
            .levels(1)
            .executor(Executor::Inline)
            .clock(clock.clone())
            .build()
            .expect("valid configuration");
        let sleepers: Vec<_> = (0..2)
            .map(|_| {
                let timer = timer.clone();
                thread::spawn(move || {
                    let sleep = timer.sleep(MILLISECOND);
                    drop(timer);
                    drop(sleep);
                })
            })
            .collect();
        drop(timer);
        for sleeper in sleepers {
            sleeper.join().unwrap();
        }
    });
}

/// The queue's side of shutdown (`ShardOwner::close`): a message whose push completed before
/// the consumer read how many positions were taken is popped by a drain through that count,
/// even while a producer that took an earlier position is still writing (a plain pop stops
/// there: the message behind it was left to a late submitter, which discarded it).
#[test]
fn queue_drain_through_delivered() {
    model(|| {
        let queue = Arc::new(QueueHook::default());
        let done = Arc::new(AtomicUsize::new(0));
        let producers: Vec<_> = (0..2u64)
            .map(|producer| {
                let (queue, done) = (queue.clone(), done.clone());
                thread::spawn(move || {
                    queue.push(producer);
                    done.fetch_add(1 << producer, Ordering::SeqCst);
                })
            })
            .collect();
        let seen = done.load(Ordering::SeqCst);
        let popped = queue.pop_through_taken();
        for producer in 0..2u64 {
            if seen & (1 << producer) != 0 {
                assert!(
                    popped.contains(&producer),
                    "delivered {producer} not popped: {popped:?}"
                );
            }
        }
        for producer in producers {
            producer.join().unwrap();
        }
    });
}
