//! A new sleep written in whole 16-byte stores, so that the copy that follows reads it at once.
//!
//! A sleep is made and copied straight away: [`sleep`](crate::sleep()) returns it into the
//! `Timeout` that [`timeout`](crate::timeout()) returns, and the caller's future stores that,
//! copying it once or more, in 16-byte loads. Made field by field, the sleep is written in
//! stores of 1 to 8 bytes, and a load that spans several stores still in flight cannot take its
//! bytes from them: it waits until they reach the cache, which they do only after every
//! instruction before them has completed, the clock read that gave the deadline (`rdtsc`)
//! included. [`Sleep::whole`] writes the sleep in 16-byte stores into an aligned place and
//! returns it from there: the compiler then copies it on in the same 16-byte pieces, and the
//! caller's first copy takes its bytes from those stores instead of waiting for the clock.
//!
//! Only the default timer's [`sleep`](crate::sleep()) does this (the path of `timeout` around a
//! small future). Around a large future, `timeout` makes its sleep out of line, in the place the
//! caller gives it, which the stores fill directly: there this costs instructions for nothing.
//! x86-64 only, where SSE2 always exists; elsewhere the sleep is returned as it is.

use super::Sleep;

impl Sleep {
    /// This sleep, written whole (see the module).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) fn whole(self) -> Sleep {
        use std::arch::x86_64::__m128i;
        use std::mem::{ManuallyDrop, MaybeUninit};
        const CHUNK: usize = size_of::<__m128i>();
        const {
            assert!(size_of::<Sleep>().is_multiple_of(CHUNK));
        }
        /// A place for a sleep, 16-byte aligned.
        #[repr(align(16))]
        struct Place(MaybeUninit<Sleep>);
        let mut whole = Place(MaybeUninit::uninit());
        let to = whole.0.as_mut_ptr().cast::<MaybeUninit<__m128i>>();
        let sleep = ManuallyDrop::new(self);
        let from = (&raw const *sleep).cast::<MaybeUninit<__m128i>>();
        for chunk in 0..size_of::<Sleep>() / CHUNK {
            // SAFETY: `to` is 16-byte aligned (`Place`), and a `Sleep` is a whole number of
            // chunks long (the assertion above), so each chunk is in bounds; `from` may not be
            // aligned, so it is read unaligned; a `MaybeUninit` may hold any bytes (padding
            // included). Volatile, so that the compiler keeps it one 16-byte store.
            unsafe { std::ptr::write_volatile(to.add(chunk), from.add(chunk).read_unaligned()) };
        }
        // SAFETY: every byte of `whole` is the byte of `sleep`, a valid `Sleep`, at the same
        // offset; `sleep` is not dropped, so this is a move.
        unsafe { whole.0.assume_init() }
    }

    /// This sleep (see the module: other targets).
    #[cfg(not(target_arch = "x86_64"))]
    #[inline(always)]
    pub(crate) fn whole(self) -> Sleep {
        self
    }
}

#[cfg(test)]
mod tests {
    use crate::{Clock, Executor, Timer, TimerState};
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    /// A sleep written whole is the same sleep, moved: its deadline, its timer once armed, and
    /// one drop (its engine's lease is counted, and let go of once).
    #[test]
    fn a_sleep_written_whole_is_the_same_sleep_moved() {
        // A manual clock: the sleep stays pending, whatever the machine does.
        let timer = Timer::builder()
            .shards(1)
            .executor(Executor::Inline)
            .clock(Clock::manual())
            .build()
            .expect("build timer");
        let sleep = timer.sleep(Duration::from_millis(10));
        let deadline = sleep.deadline();
        let mut whole = sleep.whole();
        assert_eq!(whole.deadline(), deadline);
        assert!(!whole.is_elapsed());
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(Pin::new(&mut whole).poll(&mut cx), Poll::Pending);
        assert_eq!(whole.timer.state(&whole.engine), TimerState::Pending);
        assert_eq!(timer.stats().pending, 1);
        drop(whole);
        assert_eq!(timer.stats().pending, 0, "dropping it cancelled its timer");
        drop(timer.shutdown());
    }
}
