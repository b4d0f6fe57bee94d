//! Kept timers: the pending timer of a dropped `Sleep`, kept on its thread for the next sleep of
//! the same task.
//!
//! A server's connection task makes a short-lived sleep per request (hyper's header-read
//! timeout: made when a request's head is awaited, dropped when it has arrived). Each would
//! arm a timer and take it back a moment later. A sleep made *keeping* (`Sleep::kept_on_drop`,
//! which [`HyperTimer`](crate::HyperTimer) uses on the default timer) instead leaves its timer
//! pending when it is dropped, here, under the identity of the waker that timer wakes. The
//! next keeping sleep that the same task polls on this thread, with a deadline at or after the
//! kept timer's, takes it over: no timer armed, none taken back. If the timer fires first, it
//! wakes the task once early, and the sleep that holds it then schedules one for its own
//! deadline (the later deadline case of `Sleep::reset`); a kept timer nobody takes fires so,
//! for nothing, or is let go of when its place is needed or the thread exits.
//!
//! | event | kept timers |
//! |---|---|
//! | a keeping sleep with a pending timer is dropped | kept in the place its waker's identity picks, letting go of the one there (a timer that has fired is let go of, not kept) |
//! | a keeping sleep's first poll (unarmed) finds its engine and its task's waker's identity, due at or before its deadline | taken over if still pending (read after the identity: see below), else let go of |
//! | a keeping sleep's engine refuses a timer as full | every one on the thread let go of (each holds a place of `max_pending`), and the sleep tries once more |
//! | the thread exits | every one let go of |
//!
//! A waker's identity (its addresses) names the same waker only while that waker is alive,
//! which it is while the timer that holds it is pending: so the taker compares identities, then
//! reads the timer pending, and only then knows the timer wakes its own task.
//!
//! Only the default timer's sleeps keep (it is never dropped, so a kept timer holds its engine
//! with a plain reference). A kept timer counts as pending in the timer's `stats`, and at most
//! [`KEPT`] of them are held per thread.

use super::{TimerSlot, WakerIdentity};
use crate::engine::Engine;
use std::cell::RefCell;
use std::time::Instant;

/// Places for kept timers per thread.
pub(super) const KEPT: usize = 64;

/// A kept timer: pending when kept (it may have fired since), due at `due`, waking the waker of
/// `identity`. Dropping it lets the timer go (cancelled if still pending).
pub(super) struct Kept {
    pub(super) engine: &'static Engine,
    pub(super) identity: WakerIdentity,
    pub(super) timer: TimerSlot,
    pub(super) due: Instant,
}

impl Kept {
    /// The timer, no longer kept: the caller holds its handle now.
    pub(super) fn into_timer(self) -> (TimerSlot, Instant) {
        let kept = std::mem::ManuallyDrop::new(self);
        (kept.timer, kept.due)
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.timer.cancel_and_release(self.engine);
    }
}

std::thread_local! {
    static KEPT_TIMERS: RefCell<Vec<Option<Kept>>> = const { RefCell::new(Vec::new()) };
}

/// The place of a waker's identity (its data address, whose low bits are alignment).
fn place(identity: WakerIdentity) -> usize {
    (identity.data >> 4 ^ identity.data >> 10) % KEPT
}

/// Keeps `kept` on this thread. Gives it back if it cannot be kept (the thread's kept timers
/// are gone, or in use further up the stack), or returns the timer it displaced: either way the
/// caller drops that, after this call (its drop may run user code, which may keep a timer).
pub(super) fn keep(kept: Kept) -> Option<Kept> {
    let place = place(kept.identity);
    let mut kept = Some(kept);
    let _ = KEPT_TIMERS.try_with(|all| {
        if let Ok(mut all) = all.try_borrow_mut() {
            if all.is_empty() {
                all.resize_with(KEPT, || None);
            }
            kept = std::mem::replace(&mut all[place], kept.take());
        }
    });
    kept
}

/// The timer kept for `identity` on `engine`, due at or before `deadline`, if there is one:
/// taken out.
pub(super) fn take(
    engine: &'static Engine,
    identity: WakerIdentity,
    deadline: Instant,
) -> Option<Kept> {
    KEPT_TIMERS
        .try_with(|all| {
            let mut all = all.try_borrow_mut().ok()?;
            let kept = all.get_mut(place(identity))?;
            kept.as_ref()
                .is_some_and(|kept| {
                    std::ptr::eq(kept.engine, engine)
                        && kept.identity == identity
                        && kept.due <= deadline
                })
                .then(|| kept.take())
                .flatten()
        })
        .ok()
        .flatten()
}

/// Lets go of every timer kept on this thread (for a sleep its engine refused as full: kept
/// timers hold places of its `max_pending`). Whether there was any.
pub(super) fn let_go_of_all() -> bool {
    let all = KEPT_TIMERS
        .try_with(|all| {
            all.try_borrow_mut()
                .map(|mut all| std::mem::take(&mut *all))
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let any = all.iter().any(Option::is_some);
    // Dropped here, out of the borrow.
    drop(all);
    any
}

/// How many timers this thread keeps.
#[cfg(test)]
fn kept_here() -> usize {
    KEPT_TIMERS.with(|all| all.borrow().iter().filter(|kept| kept.is_some()).count())
}

#[cfg(test)]
mod tests {
    use super::super::Sleep;
    use crate::clock::Deadline;
    use crate::{Clock, Executor, Timer};
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::Duration;

    /// A task's waker: counts its wake-ups.
    struct Task(AtomicUsize);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn task() -> (Arc<Task>, Waker) {
        let task = Arc::new(Task(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        (task, waker)
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    /// A manual-clock timer that is never dropped, as the default timer (whose sleeps keep).
    fn lasting_timer() -> (Clock, &'static Timer) {
        lasting_timer_of(Timer::builder())
    }

    fn lasting_timer_of(builder: crate::Builder) -> (Clock, &'static Timer) {
        let clock = Clock::manual();
        let timer = builder
            .shards(1)
            .tick(ms(1))
            .executor(Executor::Inline)
            .clock(clock.clone())
            .build()
            .expect("build timer");
        (clock, Box::leak(Box::new(timer)))
    }

    fn keeping(timer: &'static Timer, after: Duration) -> Sleep {
        let deadline = Deadline::At(timer.clock().now() + after);
        Sleep::new(timer.static_engine_ref(), deadline).kept_on_drop()
    }

    fn poll(sleep: &mut Sleep, waker: &Waker) -> Poll<()> {
        Pin::new(sleep).poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn the_same_tasks_next_sleep_takes_over_the_timer_of_one_dropped() {
        let (clock, timer) = lasting_timer();
        let (woken, waker) = task();
        let mut first = keeping(timer, ms(10));
        assert!(poll(&mut first, &waker).is_pending());
        drop(first);
        assert_eq!(timer.stats().pending, 1, "kept");
        let mut second = keeping(timer, ms(20));
        assert!(poll(&mut second, &waker).is_pending());
        assert_eq!(timer.stats().scheduled, 1, "taken over, not scheduled anew");
        // The kept timer fires at 10 ms: an early wake-up, and the poll schedules for 20 ms.
        clock.advance(ms(10));
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(poll(&mut second, &waker).is_pending());
        assert_eq!(timer.stats().scheduled, 2);
        clock.advance(ms(9));
        assert!(poll(&mut second, &waker).is_pending());
        clock.advance(ms(1));
        assert_eq!(woken.0.load(Ordering::SeqCst), 2);
        assert_eq!(poll(&mut second, &waker), Poll::Ready(()));
        assert_eq!(timer.stats().pending, 0);
    }

    #[test]
    fn another_tasks_sleep_and_an_earlier_deadline_schedule_their_own() {
        let (_clock, timer) = lasting_timer();
        let (_, waker) = task();
        let (_, other) = task();
        let mut first = keeping(timer, ms(10));
        assert!(poll(&mut first, &waker).is_pending());
        drop(first);
        let mut others = keeping(timer, ms(20));
        assert!(poll(&mut others, &other).is_pending());
        let mut earlier = keeping(timer, ms(5));
        assert!(poll(&mut earlier, &waker).is_pending());
        let stats = timer.stats();
        assert_eq!((stats.scheduled, stats.pending), (3, 3), "{stats:?}");
    }

    #[test]
    fn a_kept_timer_that_fired_is_let_go_of() {
        let (clock, timer) = lasting_timer();
        let (woken, waker) = task();
        let mut first = keeping(timer, ms(10));
        assert!(poll(&mut first, &waker).is_pending());
        drop(first);
        clock.advance(ms(10));
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "fired for nothing");
        let mut second = keeping(timer, ms(20));
        assert!(poll(&mut second, &waker).is_pending());
        let stats = timer.stats();
        assert_eq!(
            (stats.scheduled, stats.fired, stats.pending),
            (2, 1, 1),
            "{stats:?}"
        );
    }

    #[test]
    fn kept_timers_are_let_go_of_when_their_thread_exits() {
        let (_clock, timer) = lasting_timer();
        std::thread::spawn(move || {
            let (_, waker) = task();
            let mut sleep = keeping(timer, ms(10));
            assert!(poll(&mut sleep, &waker).is_pending());
        })
        .join()
        .expect("the thread");
        let stats = timer.stats();
        assert_eq!((stats.pending, stats.cancelled), (0, 1), "{stats:?}");
    }

    #[test]
    fn a_sleep_on_another_engine_does_not_take_a_kept_timer() {
        let (_clock, one) = lasting_timer();
        let (_clock, other) = lasting_timer();
        let (_, waker) = task();
        let mut first = keeping(one, ms(10));
        assert!(poll(&mut first, &waker).is_pending());
        drop(first);
        let mut second = keeping(other, ms(20));
        assert!(poll(&mut second, &waker).is_pending());
        assert_eq!((one.stats().pending, other.stats().scheduled), (1, 1));
        drop(second);
        assert!(super::let_go_of_all());
        assert_eq!((one.stats().pending, other.stats().pending), (0, 0));
    }

    #[test]
    fn a_timer_that_fired_is_not_kept() {
        let (clock, timer) = lasting_timer();
        let (_, waker) = task();
        let mut sleep = keeping(timer, ms(10));
        assert!(poll(&mut sleep, &waker).is_pending());
        clock.advance(ms(10));
        drop(sleep);
        assert_eq!(super::kept_here(), 0);
        assert_eq!(timer.stats().pending, 0);
    }

    #[test]
    fn a_full_engine_takes_back_the_places_of_kept_timers() {
        let (_clock, timer) = lasting_timer_of(Timer::builder().max_pending(1));
        let (_, waker) = task();
        let (_, other) = task();
        let mut first = keeping(timer, ms(10));
        assert!(poll(&mut first, &waker).is_pending());
        drop(first);
        assert_eq!(timer.stats().pending, 1, "kept, in the one place");
        // Another task's sleep: the kept timer is not its own, and its place is given back.
        let mut second = keeping(timer, ms(20));
        assert!(poll(&mut second, &other).is_pending());
        let stats = timer.stats();
        assert_eq!(
            (stats.pending, stats.scheduled, stats.cancelled),
            (1, 2, 1),
            "{stats:?}"
        );
    }
}
