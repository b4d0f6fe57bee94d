//! Kept timers: the pending timer of a dropped `Sleep`, kept on its thread for the next sleep of
//! the same task.
//!
//! A task that loops over short-lived sleeps (a timeout around each request of a connection,
//! hyper's header-read timeout made when a request's head is awaited and dropped when it has
//! arrived) would arm a timer for each and take it back a moment later. A sleep made *keeping*
//! (`Sleep::with`, `keep`: the default timer's free functions and
//! `HyperTimer` on the default timer make them) instead leaves its timer
//! pending when it is dropped, here, under the identity of the waker that timer wakes. The
//! next keeping sleep that the same task polls on this thread, with a deadline whose tick is at
//! or after the kept timer's, takes it over: no timer armed, none taken back, no waker cloned
//! or dropped.
//! If the timer fires first, it wakes the task once early, and the sleep that holds it then
//! schedules one for its own deadline (the later deadline case of `Sleep::reset`); a kept
//! timer nobody takes fires so, for nothing, or is let go of when its place is needed or the
//! thread exits.
//!
//! The timer of a thread's latest keeping drop is the *latest*, held apart from the table (on
//! a cache line of its own: see `Latest`): a task that loops takes its timer over in the same
//! poll that dropped it (a timeout ends, the next one begins), and then the table is not
//! touched. The next keeping drop on the thread places the latest in the table, but only for a
//! task that has been placed there before (its identity is *known* here): a task that makes one
//! timeout and ends (a task per request) leaves only its identity, and its timer is cancelled
//! then. So the tasks whose memory a kept
//! timer holds (through the waker its task holds) are tasks that loop over sleeps, at most
//! [`MAX_PLACES`] per thread, each for at most its timer's delay, and the latest's task.
//!
//! An identity has one place in its thread's table (a hash of the waker's data address). The
//! table starts at [`FIRST_PLACES`] places and doubles, up to [`MAX_PLACES`] (64 bytes each),
//! when an identity to be noted finds its place taken by another's.
//!
//! | event | kept timers |
//! |---|---|
//! | a keeping sleep with a timer is dropped | its timer becomes the latest, pending or not (not read: the take reads it); the one it replaces is placed (next row) |
//! | the latest is placed, its identity known | kept in its place, letting go of a timer there (the same task's) |
//! | the same, its identity not known | noted in its place if that is free (the table grows if it can; at its largest, another's identity without a timer is noted over); the timer is let go of |
//! | a keeping sleep's first poll (unarmed) finds its engine and its task's waker's identity in the latest or its place, due at a tick at or before its deadline's (on a manual clock, a deadline that has not passed: its shard turns only in `advance`) | taken over if still pending (known after the identity: see below), else let go of; a known identity stays known |
//! | the table grows | every entry placed again; of two that meet, one with a timer stays, and the other's timer is let go of |
//! | the thread exits | every one let go of |
//!
//! A waker's identity (its addresses) names the same waker only while that waker is alive,
//! which it is while the timer that holds it is pending: so the taker compares identities, then
//! knows the timer pending (`TimerSlot::known_state`), and only then knows
//! the timer wakes its own task. A known identity without a timer names nothing alive: if
//! another task's waker comes to have it, that task only has its first timer kept where it
//! would have been cancelled.
//!
//! Only the default timer's sleeps keep (it is never dropped, so a kept timer holds its engine
//! with a plain reference), and only if it has no `max_pending` limit (`Timer::keeps_timers`
//! says why). A kept timer counts as pending in the timer's `stats`.

use super::{Sleep, TimerSlot, WakerIdentity};
use crate::TimerState;
use crate::clock::Deadline;
use crate::engine::Engine;
use std::cell::{Cell, RefCell};
use std::mem::ManuallyDrop;

/// Places in a thread's table when it first keeps (a power of two).
const FIRST_PLACES: usize = 256;
/// Places in a thread's table at most (a power of two): the most timers a thread keeps.
const MAX_PLACES: usize = 4096;

/// A kept timer as it is held: pending or fired (it is read when taken), due at its tick,
/// waking the waker of the identity its place (or the latest's) holds. Copied, it lets nothing
/// go: [`Kept`] does, when dropped.
#[derive(Clone, Copy)]
struct RawKept {
    engine: &'static Engine,
    timer: TimerSlot,
    /// The deadline of the sleep that kept it, at whose tick or before the timer is due (as an
    /// armed sleep's timer is): a sleep whose deadline is surely no earlier
    /// (`Deadline::surely_no_later_than`) may take it without its deadline's tick computed.
    bound: Deadline,
}

impl RawKept {
    /// The timer of `sleep` (armed, on `engine`).
    #[inline]
    fn of(engine: &'static Engine, sleep: &Sleep) -> RawKept {
        RawKept {
            engine,
            timer: sleep.timer,
            bound: sleep.deadline,
        }
    }

    /// Whether a keeping sleep on `engine` may take it over (see [`take`]): its engine's, due
    /// at a tick no later than the sleep's deadline's, and still pending (known after the
    /// identities matched: the kept timer's waker is alive, so it is the sleep's task's: see
    /// the module documentation).
    #[inline(always)]
    fn fits(&self, engine: &'static Engine, sleep: &Sleep) -> Fit {
        if !std::ptr::eq(self.engine, engine)
            || !(self.bound.surely_no_later_than(sleep.deadline)
                || engine
                    .clock
                    .tick_no_later_than(self.timer.tick, sleep.deadline))
        {
            return Fit::No;
        }
        if self.timer.known_state(engine) != TimerState::Pending {
            return Fit::Gone;
        }
        Fit::Yes
    }

    /// [`fits`](Self::fits)'s `Yes` where it is known in a few instructions: its engine's, due
    /// at a tick no later than the sleep's deadline's (`ClockLine::surely_due_by`, given its
    /// bound), and surely pending (`TimerSlot::surely_pending`): both on the line the sleep
    /// holds, the engine not read. False says nothing.
    #[inline(always)]
    fn surely_fits(&self, engine: &'static Engine, sleep: &Sleep) -> bool {
        let line = sleep.engine.line();
        std::ptr::eq(self.engine, engine)
            && line.surely_due_by(self.timer.tick, self.bound, sleep.deadline)
            && self.timer.surely_pending(line)
    }

    /// Arms `sleep` (unarmed) with it, for the task of `identity`.
    #[inline(always)]
    fn arm(self, identity: WakerIdentity, sleep: &mut Sleep) {
        sleep.timer = self.timer;
        sleep.waker = identity;
        sleep.armed = true;
    }

    /// It, to let go of when dropped.
    #[inline]
    fn into_kept(self) -> Kept {
        Kept(self)
    }
}

/// What a kept timer is to a sleep that would take it over ([`RawKept::fits`]).
enum Fit {
    /// It may take it.
    Yes,
    /// Not for it: another engine's, or due later.
    No,
    /// Fired, or cancelled by shutdown: its task is gone already, so letting go of it runs no
    /// user code, and may happen in the table's borrow.
    Gone,
}

/// A kept timer that lets its timer go (cancelled if still pending) when dropped.
struct Kept(RawKept);

impl Kept {
    /// It, as held without its drop.
    #[inline]
    fn into_raw(self) -> RawKept {
        ManuallyDrop::new(self).0
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.0.timer.cancel_and_release(self.0.engine);
    }
}

/// One place of a thread's table: a known identity (`FREE`: none), and the timer kept for it.
/// One cache line: a keep or a take touches that line only.
#[derive(Default)]
#[repr(align(64))]
struct Place {
    identity: WakerIdentity,
    held: Option<Kept>,
}

/// The identity of a free place: no waker's.
const FREE: WakerIdentity = WakerIdentity::NONE;

/// A thread's table of places.
#[derive(Default)]
struct Places(Vec<Place>);

impl Places {
    /// The place of `identity`, in a table that is not empty.
    #[inline]
    fn of(&self, identity: WakerIdentity) -> usize {
        let hash = (identity.data as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (hash >> 40) as usize & (self.0.len() - 1)
    }

    /// Where `identity` is known, if it is.
    #[inline]
    fn known(&self, identity: WakerIdentity) -> Option<usize> {
        if self.0.is_empty() {
            return None;
        }
        let place = self.of(identity);
        (self.0[place].identity == identity).then_some(place)
    }

    /// Places `kept`, the timer of `identity`, if that identity is known (see the module
    /// documentation), else notes the identity. Returns the timer to let go of: the one it
    /// displaces (the same task's), or `kept` if not known.
    #[inline]
    fn place(&mut self, identity: WakerIdentity, kept: Kept) -> Option<Kept> {
        let Some(place) = self.known(identity) else {
            self.note(identity);
            return Some(kept);
        };
        self.0[place].held.replace(kept)
    }

    /// Notes `identity` in its place if that is free; if it is another's, grows the table (if
    /// it can) and tries again, else notes it over the other's identity if that has no timer.
    #[cold]
    fn note(&mut self, identity: WakerIdentity) {
        if self.0.is_empty() {
            self.0.resize_with(FIRST_PLACES, Place::default);
        }
        loop {
            let full = self.0.len() >= MAX_PLACES;
            let index = self.of(identity);
            let place = &mut self.0[index];
            if place.identity == FREE || full && place.held.is_none() {
                place.identity = identity;
                return;
            }
            if full {
                return;
            }
            self.grow();
        }
    }

    /// Doubles the table, placing every entry again. Of two entries that come to share a
    /// place, one with a timer stays; the other is forgotten, and its timer let go of here, in
    /// the table's borrow (rare: at most a few times in a thread's life). Its task's drop, if it
    /// runs one, is contained (`executor::contain`), and a sleep that it may drop keeps its
    /// timer as the latest, letting go of the latest it displaces (the table is in use).
    fn grow(&mut self) {
        let old = std::mem::take(&mut self.0);
        self.0.resize_with(old.len() * 2, Place::default);
        for entry in old {
            if entry.identity == FREE {
                continue;
            }
            let place = self.of(entry.identity);
            let incumbent = &mut self.0[place];
            if incumbent.identity == FREE || incumbent.held.is_none() && entry.held.is_some() {
                drop(std::mem::replace(incumbent, entry));
            }
        }
    }
}

/// The timer of a thread's latest keeping drop and its identity (`FREE` and none if there is
/// none), not placed in the table yet: the next keeping drop places it. A task that takes its
/// timer over in the same poll that dropped it (a loop over timeouts) finds it here, without a
/// look at the table.
///
/// One cache line, in a thread-local of its own without a destructor, so that a take or a keep
/// reads neither a registration state nor a borrow flag: a copy in and out of a `Cell` (no
/// user code runs in between). The table's destructor lets go of its timer ([`Table`]), so a
/// keep puts a timer here only while that destructor is registered and has not run. The
/// identity is `FREE` unless a keep has registered that destructor and it has not run since
/// (it sets [`Latest::NONE`]): a keep that finds an identity and no timer here
/// ([`keep_as_latest`]) needs no look at the table.
#[derive(Clone, Copy)]
struct Latest {
    identity: WakerIdentity,
    kept: Option<RawKept>,
}

/// The thread's [`Latest`], on a cache line of its own (the alignment is the line's, not the
/// copies': a copy on the stack needs none).
#[repr(align(64))]
struct LatestLine(Cell<Latest>);

const _: () = {
    assert!(size_of::<LatestLine>() == 64);
};

impl Latest {
    const NONE: Latest = Latest {
        identity: FREE,
        kept: None,
    };
}

/// Empties the latest, leaving its identity (`identity`) known as the latest's.
#[inline(always)]
fn empty_latest(identity: WakerIdentity) {
    LATEST.with(|line| {
        line.0.set(Latest {
            identity,
            kept: None,
        })
    });
}

/// A thread's table of places. Dropped at the thread's exit, it lets go of its timers and of
/// the latest's.
#[derive(Default)]
struct Table {
    places: Places,
}

impl Drop for Table {
    fn drop(&mut self) {
        let latest = LATEST.with(|line| line.0.replace(Latest::NONE));
        drop(latest.kept.map(RawKept::into_kept));
    }
}

std::thread_local! {
    static LATEST: LatestLine = const { LatestLine(Cell::new(Latest::NONE)) };
    static TABLE: RefCell<Table> = const {
        RefCell::new(Table {
            places: Places(Vec::new()),
        })
    };
}

/// Keeps the timer of `sleep` (armed, on `engine`; pending or not) on this thread, as the
/// latest; the one it replaces there goes to the table if its identity is known here (see the
/// module documentation), else its identity is noted and it is let go of. The sleep's drop ends
/// there. If the table is gone (the thread exits), it is let go of at once.
///
/// The case of a loop, whose previous timer was taken over (the latest is empty), is
/// [`keep_as_latest`], in line in the sleep's drop; this function, out of line, is every case.
#[inline(never)]
pub(super) fn keep(engine: &'static Engine, sleep: &Sleep) {
    let kept = RawKept::of(engine, sleep);
    // Registers the table's destructor, which lets go of the latest, unless it has run.
    if TABLE.try_with(|_| ()).is_err() {
        drop(kept.into_kept());
        return;
    }
    let latest = Latest {
        identity: sleep.waker,
        kept: Some(kept),
    };
    // Swapped in before the previous is placed (which may run user code that keeps a timer),
    // and only copied out if there is one (the previous was taken over, in a loop).
    let previous = LATEST.with(|line| {
        if line.0.get().kept.is_none() {
            line.0.set(latest);
            return None;
        }
        Some(line.0.replace(latest))
    });
    if let Some(Latest {
        identity,
        kept: Some(previous),
    }) = previous
    {
        place(identity, previous.into_kept());
    }
}

/// [`keep`] where the latest is empty and has an identity: the timer of
/// `sleep` becomes the latest, and nothing is placed. Whether it did; if not, [`keep`] does
/// the rest. A few instructions, no call: the drop of a loop's sleep needs no stack frame.
#[inline(always)]
pub(super) fn keep_as_latest(engine: &'static Engine, sleep: &Sleep) -> bool {
    LATEST.with(|line| {
        let latest = line.0.get();
        // An identity there says the table's destructor is registered (see `Latest`).
        if latest.identity == FREE || latest.kept.is_some() {
            return false;
        }
        line.0.set(Latest {
            identity: sleep.waker,
            kept: Some(RawKept::of(engine, sleep)),
        });
        true
    })
}

/// Places `kept`, the timer of `identity`, in this thread's table (see [`Places::place`]). A
/// timer let go of (also this one if the table is gone, or in use further up the stack) is
/// dropped after the table's borrow ends: its drop may run user code, which may keep a timer.
#[inline(never)]
fn place(identity: WakerIdentity, kept: Kept) {
    let mut kept = Some(kept);
    let let_go = TABLE
        .try_with(|table| {
            table
                .try_borrow_mut()
                .ok()?
                .places
                .place(identity, kept.take()?)
        })
        .ok()
        .flatten();
    drop(let_go);
    drop(kept);
}

/// Arms `sleep` (unarmed, on `engine`, polled with a waker of `identity`) with the timer kept
/// for `identity`, the latest or in its place, if there is one due at a tick at or before its
/// deadline's and still pending: taken out (a known identity stays known). One that is no
/// longer pending is let go of. Whether it did.
///
/// The case of a loop, the latest its task's and surely fitting ([`RawKept::surely_fits`]), is
/// [`take_latest`], in line in the sleep's poll; this function, out of line, is every case.
#[inline(never)]
pub(super) fn take(engine: &'static Engine, identity: WakerIdentity, sleep: &mut Sleep) -> bool {
    if let Some(kept) = latest_of(identity) {
        match kept.fits(engine, sleep) {
            Fit::Yes => {
                take_over_latest(kept, identity, sleep);
                return true;
            }
            Fit::Gone => {
                empty_latest(identity);
                drop(kept.into_kept());
            }
            Fit::No => {}
        }
    }
    take_placed(engine, identity, sleep)
}

/// [`take`] where the latest is the task's and surely fits: takes it over. Whether it did; if
/// not, [`take`] decides. A few instructions, no call: the poll that takes needs no stack frame.
#[inline(always)]
pub(super) fn take_latest(
    engine: &'static Engine,
    identity: WakerIdentity,
    sleep: &mut Sleep,
) -> bool {
    if let Some(kept) = latest_of(identity)
        && kept.surely_fits(engine, sleep)
    {
        take_over_latest(kept, identity, sleep);
        return true;
    }
    false
}

/// The latest kept timer, if it is the one of `identity`.
#[inline(always)]
fn latest_of(identity: WakerIdentity) -> Option<RawKept> {
    let latest = LATEST.with(|line| line.0.get());
    if latest.identity == identity {
        latest.kept
    } else {
        None
    }
}

/// Arms `sleep` with `kept`, the latest, for `identity`'s task: the latest is emptied, its
/// identity stays.
#[inline(always)]
fn take_over_latest(kept: RawKept, identity: WakerIdentity, sleep: &mut Sleep) {
    empty_latest(identity);
    kept.arm(identity, sleep);
}

/// [`take`] from the place of `identity`, if it is known.
#[inline(never)]
fn take_placed(engine: &'static Engine, identity: WakerIdentity, sleep: &mut Sleep) -> bool {
    TABLE
        .try_with(|table| {
            let mut table = table.try_borrow_mut().ok()?;
            let place = table.places.known(identity)?;
            let held = &mut table.places.0[place].held;
            match held.as_ref()?.0.fits(engine, sleep) {
                Fit::Yes => {
                    held.take()?.into_raw().arm(identity, sleep);
                    Some(())
                }
                Fit::Gone => {
                    *held = None;
                    None
                }
                Fit::No => None,
            }
        })
        .is_ok_and(|taken| taken.is_some())
}

/// How many timers this thread keeps.
#[cfg(test)]
fn kept_here() -> usize {
    let latest = LATEST.with(|line| line.0.get());
    let placed = TABLE.with(|table| {
        let table = table.borrow();
        let placed = table.places.0.iter().filter(|place| place.held.is_some());
        placed.count()
    });
    usize::from(latest.kept.is_some()) + placed
}

/// Lets go of every timer kept on this thread. Whether there was any.
#[cfg(test)]
fn let_go_of_all() -> bool {
    let any = kept_here() > 0;
    let table = TABLE
        .try_with(|table| {
            table
                .try_borrow_mut()
                .map(|mut table| std::mem::take(&mut *table))
                .unwrap_or_default()
        })
        .unwrap_or_default();
    // Dropped here, out of the borrow: the latest goes with it.
    drop(table);
    any
}

/// Places the latest kept timer as the next keep would.
#[cfg(test)]
fn place_latest() {
    let latest = LATEST.with(|line| line.0.replace(Latest::NONE));
    if let Some(kept) = latest.kept {
        place(latest.identity, kept.into_kept());
    }
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
        Sleep::with(
            timer.static_engine_ref(),
            deadline,
            false,
            timer.keeps_timers(),
        )
    }

    fn poll(sleep: &mut Sleep, waker: &Waker) -> Poll<()> {
        Pin::new(sleep).poll(&mut Context::from_waker(waker))
    }

    /// Arms a keeping sleep of `after` for `waker`'s task, and drops it.
    fn arm_and_drop(timer: &'static Timer, waker: &Waker, after: Duration) {
        let mut sleep = keeping(timer, after);
        assert!(poll(&mut sleep, waker).is_pending());
        drop(sleep);
    }

    /// Makes `waker`'s task known on this thread: one keeping sleep armed and dropped, its timer
    /// then placed as the next keep would (cancelled, not kept).
    fn make_known(timer: &'static Timer, waker: &Waker) {
        let before = timer.stats();
        arm_and_drop(timer, waker, ms(1_000));
        super::place_latest();
        let after = timer.stats();
        assert_eq!(after.pending, before.pending, "not kept: {after:?}");
        assert_eq!(after.cancelled, before.cancelled + 1, "{after:?}");
    }

    #[test]
    fn the_same_tasks_next_sleep_takes_over_the_timer_of_one_dropped() {
        let (clock, timer) = lasting_timer();
        let (woken, waker) = task();
        make_known(timer, &waker);
        arm_and_drop(timer, &waker, ms(10));
        assert_eq!(timer.stats().pending, 1, "kept");
        let mut second = keeping(timer, ms(20));
        assert!(poll(&mut second, &waker).is_pending());
        assert_eq!(timer.stats().scheduled, 2, "taken over, not scheduled anew");
        // The kept timer fires at 10 ms: an early wake-up, and the poll schedules for 20 ms.
        clock.advance(ms(10));
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(poll(&mut second, &waker).is_pending());
        assert_eq!(timer.stats().scheduled, 3);
        clock.advance(ms(9));
        assert!(poll(&mut second, &waker).is_pending());
        clock.advance(ms(1));
        assert_eq!(woken.0.load(Ordering::SeqCst), 2);
        assert_eq!(poll(&mut second, &waker), Poll::Ready(()));
        assert_eq!(timer.stats().pending, 0);
    }

    /// On a manual clock a shard turns only in `advance`: a kept timer due in a tick the clock
    /// has not reached would hold a sleep whose deadline has passed until an advance that may
    /// never come.
    #[test]
    fn a_sleep_whose_deadline_passed_on_a_manual_clock_takes_no_kept_timer() {
        let (clock, timer) = lasting_timer();
        let (woken, waker) = task();
        // Kept: due at tick 1 (0.5 ms rounded up).
        arm_and_drop(timer, &waker, Duration::from_micros(500));
        // Tick 0 still: the kept timer is pending.
        clock.advance(Duration::from_micros(700));
        assert_eq!(timer.stats().pending, 1);
        let passed = Deadline::At(clock.now() - Duration::from_micros(100));
        let mut sleep = Sleep::with(timer.static_engine_ref(), passed, false, true);
        assert_eq!(poll(&mut sleep, &waker), Poll::Ready(()));
        assert_eq!(woken.0.load(Ordering::SeqCst), 0);
        assert!(super::let_go_of_all(), "the kept timer stays");
    }

    #[test]
    fn a_tasks_first_timer_is_kept_only_as_the_latest() {
        let (_clock, timer) = lasting_timer();
        let (_, waker) = task();
        let (_, other) = task();
        arm_and_drop(timer, &waker, ms(10));
        assert_eq!(super::kept_here(), 1, "the latest");
        // The next keep places it: its task is not known, so it is cancelled.
        arm_and_drop(timer, &other, ms(10));
        assert_eq!(super::kept_here(), 1, "only the other's, the latest");
        let stats = timer.stats();
        assert_eq!((stats.pending, stats.cancelled), (1, 1), "{stats:?}");
    }

    #[test]
    fn a_task_that_loops_takes_over_the_latest_timer_at_once() {
        let (_clock, timer) = lasting_timer();
        let (_, waker) = task();
        for _ in 0..3 {
            arm_and_drop(timer, &waker, ms(10));
        }
        let stats = timer.stats();
        assert_eq!((stats.scheduled, stats.pending), (1, 1), "{stats:?}");
        assert!(super::let_go_of_all());
        assert_eq!(timer.stats().pending, 0);
    }

    /// A task with two keeping sleeps at once (a timeout inside a timeout): each takes a timer
    /// of its own, and none is lost.
    #[test]
    fn nested_sleeps_of_one_task_each_hold_a_timer_of_their_own() {
        let (clock, timer) = lasting_timer();
        let (woken, waker) = task();
        make_known(timer, &waker);
        for _ in 0..3 {
            let mut outer = keeping(timer, ms(20));
            let mut inner = keeping(timer, ms(10));
            assert!(poll(&mut inner, &waker).is_pending());
            assert!(poll(&mut outer, &waker).is_pending());
            drop(inner);
            drop(outer);
        }
        let stats = timer.stats();
        assert_eq!(
            super::kept_here(),
            2,
            "the outer's the latest, the inner's placed"
        );
        assert_eq!((stats.scheduled, stats.pending), (3, 2), "{stats:?}");
        // Each sleep still wakes its task at its own deadline.
        let mut outer = keeping(timer, ms(20));
        let mut inner = keeping(timer, ms(10));
        assert!(poll(&mut inner, &waker).is_pending());
        assert!(poll(&mut outer, &waker).is_pending());
        clock.advance(ms(10));
        assert!(woken.0.load(Ordering::SeqCst) >= 1);
        assert!(poll(&mut inner, &waker).is_ready());
        assert!(poll(&mut outer, &waker).is_pending());
        clock.advance(ms(10));
        assert!(poll(&mut outer, &waker).is_ready());
        assert!(!super::let_go_of_all(), "both taken, so none left kept");
        assert_eq!(timer.stats().pending, 0);
    }

    #[test]
    fn another_tasks_sleep_and_an_earlier_deadline_schedule_their_own() {
        let (_clock, timer) = lasting_timer();
        let (_, waker) = task();
        let (_, other) = task();
        make_known(timer, &waker);
        make_known(timer, &other);
        arm_and_drop(timer, &waker, ms(10));
        let mut others = keeping(timer, ms(20));
        assert!(poll(&mut others, &other).is_pending());
        let mut earlier = keeping(timer, ms(5));
        assert!(poll(&mut earlier, &waker).is_pending());
        let stats = timer.stats();
        assert_eq!((stats.scheduled, stats.pending), (5, 3), "{stats:?}");
    }

    #[test]
    fn a_kept_timer_that_fired_is_let_go_of() {
        let (clock, timer) = lasting_timer();
        let (woken, waker) = task();
        make_known(timer, &waker);
        arm_and_drop(timer, &waker, ms(10));
        clock.advance(ms(10));
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "fired for nothing");
        let mut second = keeping(timer, ms(20));
        assert!(poll(&mut second, &waker).is_pending());
        let stats = timer.stats();
        assert_eq!(
            (stats.scheduled, stats.fired, stats.pending),
            (3, 1, 1),
            "{stats:?}"
        );
    }

    #[test]
    fn kept_timers_are_let_go_of_when_their_thread_exits() {
        let (_clock, timer) = lasting_timer();
        std::thread::spawn(move || {
            let (_, waker) = task();
            make_known(timer, &waker);
            arm_and_drop(timer, &waker, ms(10));
            assert_eq!(super::kept_here(), 1);
        })
        .join()
        .expect("the thread");
        let stats = timer.stats();
        assert_eq!((stats.pending, stats.cancelled), (0, 2), "{stats:?}");
    }

    /// On the system clock a loop's take and keep are the in-line cases (`take_latest`,
    /// `keep_as_latest`): one timer serves every sleep, and the thread's exit lets go of it,
    /// also where the thread's first keep came before any take there (a sleep armed on another
    /// thread: nothing had registered the table's destructor).
    #[test]
    fn a_loop_on_the_system_clock_keeps_one_timer_until_its_thread_exits() {
        let timer: &'static Timer = Box::leak(Box::new(
            Timer::builder()
                .shards(1)
                .executor(Executor::Inline)
                .clock(Clock::system())
                .build()
                .expect("build timer"),
        ));
        let (_, waker) = task();
        let mut armed_elsewhere = keeping(timer, ms(60_000));
        assert!(poll(&mut armed_elsewhere, &waker).is_pending());
        std::thread::spawn(move || {
            drop(armed_elsewhere);
            for _ in 0..5 {
                arm_and_drop(timer, &waker, ms(60_000));
            }
            // (Not `kept_here`, which would register the table's destructor.)
            let stats = timer.stats();
            assert_eq!((stats.scheduled, stats.pending), (1, 1), "{stats:?}");
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
        make_known(one, &waker);
        arm_and_drop(one, &waker, ms(10));
        let mut second = keeping(other, ms(20));
        assert!(poll(&mut second, &waker).is_pending());
        assert_eq!((one.stats().pending, other.stats().scheduled), (1, 1));
        drop(second);
        assert!(super::let_go_of_all());
        assert_eq!((one.stats().pending, other.stats().pending), (0, 0));
    }

    #[test]
    fn a_timer_that_fired_is_not_taken() {
        let (clock, timer) = lasting_timer();
        let (task, waker) = task();
        make_known(timer, &waker);
        let mut sleep = keeping(timer, ms(10));
        assert!(poll(&mut sleep, &waker).is_pending());
        clock.advance(ms(10));
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        // Kept without a look at it: the take looks, and lets it go.
        drop(sleep);
        assert_eq!(super::kept_here(), 1);
        let mut next = keeping(timer, ms(10));
        assert!(poll(&mut next, &waker).is_pending());
        assert_eq!(super::kept_here(), 0);
        assert_eq!(timer.stats().pending, 1, "its own timer");
        clock.advance(ms(10));
        assert_eq!(task.0.load(Ordering::SeqCst), 2);
        assert!(poll(&mut next, &waker).is_ready());
        assert_eq!(timer.stats().pending, 0);
    }

    /// Under a `max_pending` limit a dropped sleep keeps nothing: a timer kept on one thread
    /// would hold a place of the limit that another thread's sleep could not get back.
    #[test]
    fn an_engine_with_a_limit_keeps_no_timer() {
        let (_clock, timer) = lasting_timer_of(Timer::builder().max_pending(1));
        // On a thread that stays alive, a task's sleeps are armed and dropped: as a known task's
        // they would keep their timers.
        let (dropped_tx, dropped_rx) = std::sync::mpsc::channel();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let other_thread = std::thread::spawn(move || {
            let (_, waker) = task();
            arm_and_drop(timer, &waker, ms(10_000));
            arm_and_drop(timer, &waker, ms(10_000));
            dropped_tx.send(super::kept_here()).expect("send");
            let _ = end_rx.recv();
        });
        let kept_there = dropped_rx.recv().expect("recv");
        let stats = timer.stats();
        assert_eq!((kept_there, stats.pending), (0, 0), "{stats:?}");
        // The one place of the limit is free for this thread's sleep.
        let (_, waker) = task();
        let mut sleep = keeping(timer, ms(20));
        assert!(poll(&mut sleep, &waker).is_pending());
        drop(sleep);
        assert_eq!(super::kept_here(), 0);
        let stats = timer.stats();
        assert_eq!(
            (stats.pending, stats.scheduled, stats.cancelled),
            (0, 3, 3),
            "{stats:?}"
        );
        end_tx.send(()).expect("send");
        other_thread.join().expect("join");
    }

    /// A deadline `after` from now, nanoseconds since the clock's origin (the form the cycle
    /// clock makes) if `nanos`, else an instant.
    fn deadline_after(timer: &'static Timer, after: Duration, nanos: bool) -> Deadline {
        if nanos {
            let now = timer.static_engine().clock.now_nanos();
            Deadline::Nanos(now + u64::try_from(after.as_nanos()).expect("a short delay"))
        } else {
            Deadline::At(timer.clock().now() + after)
        }
    }

    /// One step of a task's loop over sleeps: a deadline (milliseconds, nanoseconds form or
    /// not), perhaps reset once after the first poll (to milliseconds from then, either form),
    /// and the milliseconds the clock then advances before the sleep is dropped.
    type Step = (u64, bool, Option<(u64, bool)>, u64);

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// A task's sleeps, each taking over the timer its predecessor kept where the kept
        /// timer is due no later (found by the deadlines' comparison where both have one form,
        /// else by their ticks), deadlines moved earlier and later: each is woken when ready,
        /// never completes before its deadline, and completes once its deadline's tick has
        /// come; no timer is left behind.
        #[test]
        fn sleeps_taking_kept_timers_complete_at_their_deadlines(
            steps in proptest::collection::vec(
                (
                    0u64..40,
                    proptest::bool::ANY,
                    proptest::option::of((0u64..40, proptest::bool::ANY)),
                    0u64..50,
                ),
                1..30,
            )
        ) {
            let (clock, timer) = lasting_timer();
            let engine = timer.static_engine();
            let (woken, waker) = task();
            make_known(timer, &waker);
            for (after, nanos, reset, advance) in steps as Vec<Step> {
                let mut sleep = Sleep::with(
                    timer.static_engine_ref(),
                    deadline_after(timer, ms(after), nanos),
                    false,
                    true,
                );
                let mut done = poll(&mut sleep, &waker).is_ready();
                if let Some((after, nanos)) = reset
                    && !done
                {
                    sleep.reset_to(deadline_after(timer, ms(after), nanos));
                    done = poll(&mut sleep, &waker).is_ready();
                }
                let deadline = engine.clock.instant_of(sleep.deadline);
                let due = engine
                    .clock
                    .instant_of_tick(engine.clock.tick_of(sleep.deadline))
                    .expect("a near tick");
                proptest::prop_assert!(!done || clock.now() >= deadline, "early");
                for _ in 0..advance {
                    if done {
                        break;
                    }
                    let wakes = woken.0.load(Ordering::SeqCst);
                    clock.advance(ms(1));
                    let ready = poll(&mut sleep, &waker).is_ready();
                    let woke = woken.0.load(Ordering::SeqCst) > wakes;
                    proptest::prop_assert!(!ready || woke, "ready without a wake-up");
                    proptest::prop_assert!(!ready || clock.now() >= deadline, "early");
                    proptest::prop_assert!(ready || clock.now() < due, "late");
                    done = ready;
                }
                drop(sleep);
            }
            super::let_go_of_all();
            let stats = timer.stats();
            proptest::prop_assert_eq!(stats.pending, 0, "{:?}", stats);
        }
    }

    /// A thread's table grows to hold the timers of many tasks that loop over sleeps; at its
    /// largest, a task whose place another's timer holds has its timers cancelled as before.
    #[test]
    fn a_thousand_tasks_looping_on_one_thread_keep_nearly_all_their_timers() {
        let (_clock, timer) = lasting_timer();
        let wakers: Vec<(Arc<Task>, Waker)> = (0..1000).map(|_| task()).collect();
        let mut scheduled = Vec::new();
        for _round in 0..4 {
            for (_, waker) in &wakers {
                arm_and_drop(timer, waker, ms(30_000));
            }
            scheduled.push(timer.stats().scheduled);
        }
        let kept = super::kept_here();
        // The first round notes the tasks, the second keeps their timers, the next two take
        // them over, but for those whose places collide at the table's largest: about one in
        // nine of 1,000 wakers' addresses in 4,096 places, which vary from run to run.
        assert!(kept > 800, "{kept} kept");
        let stats = timer.stats();
        assert_eq!(stats.pending, kept as u64, "{stats:?}");
        assert!(scheduled[3] - scheduled[2] < 200, "{scheduled:?}");
        assert!(super::let_go_of_all());
        assert_eq!(timer.stats().pending, 0);
    }
}
