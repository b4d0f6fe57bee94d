//! [`Task`]: a type-erased task that stores small closures inline.
//!
//! Most timer tasks capture a few words (an id, an `Arc`, a `Waker`). Boxing each would cost a
//! heap allocation of at least 32 bytes plus a 16-byte fat pointer. A `Task` is 24 bytes: a
//! pointer to a static vtable and two words of inline storage. Closures that fit (at most 16
//! bytes, alignment at most 8) live in those words; bigger ones are boxed and the box pointer
//! lives there instead.
//!
//! | kind        | built by                 | runs                                          |
//! |-------------|--------------------------|-----------------------------------------------|
//! | once        | [`Task::new`]            | on the executor, once                         |
//! | once inline | [`Task::new_inline`]     | on the shard thread right after its turn      |
//! | repeating   | [`Task::new_repeating`]  | on the executor, once per period; re-armed    |

use std::mem::{self, ManuallyDrop, MaybeUninit};

/// Inline storage: two machine words.
type Storage = MaybeUninit<[usize; 2]>;

/// What a repeating task does after a run: re-arm at a tick, or stop.
pub(crate) trait Repeat: Send + 'static {
    /// Runs once. `start_nanos` is when the run started (nanoseconds since the clock's origin);
    /// `now_nanos` reads the clock. Returns when the next run is due (nanoseconds since the
    /// origin), or `None` to stop.
    fn run(&mut self, start_nanos: u64, now_nanos: &dyn Fn() -> u64) -> Option<u64>;

    /// A reset moved the next run to `due_nanos`: the schedule restarts from there.
    fn reanchor(&mut self, due_nanos: u64);
}

struct TaskVTable {
    /// Moves the closure out of the storage and calls it.
    call: unsafe fn(*mut Storage),
    /// For repeating tasks: one run through `&mut` (the task stays alive).
    repeat: Option<unsafe fn(*mut Storage) -> *mut dyn Repeat>,
    /// Drops the closure in place without calling it.
    drop: unsafe fn(*mut Storage),
    /// Whether that drop runs code of the user's (a destructor of something the closure
    /// captured); if not, it cannot panic and the engine may drop the task anywhere.
    drop_runs_user_code: bool,
    /// Whether the shard runs it on its own thread rather than on the executor.
    runs_inline: bool,
}

/// Whether a closure of type `F` is stored inline.
const fn fits_inline<F>() -> bool {
    mem::size_of::<F>() <= mem::size_of::<Storage>()
        && mem::align_of::<F>() <= mem::align_of::<Storage>()
}

struct InlineVTable<F, const RUNS_INLINE: bool>(std::marker::PhantomData<F>);

impl<F: FnOnce(), const RUNS_INLINE: bool> InlineVTable<F, RUNS_INLINE> {
    const VTABLE: TaskVTable = TaskVTable {
        call: Self::call,
        repeat: None,
        drop: Self::drop,
        drop_runs_user_code: mem::needs_drop::<F>(),
        runs_inline: RUNS_INLINE,
    };

    /// # Safety
    /// `storage` holds a live `F` written by [`Task::new`]; it is not used again afterwards.
    unsafe fn call(storage: *mut Storage) {
        // SAFETY: per the contract, storage holds an `F` (fits_inline checked its layout), and
        // reading it out transfers ownership; the caller never touches the storage again.
        let function = unsafe { storage.cast::<F>().read() };
        function();
    }

    /// # Safety
    /// As for `call`.
    unsafe fn drop(storage: *mut Storage) {
        // SAFETY: as in `call`; the value is dropped exactly once here.
        unsafe { storage.cast::<F>().drop_in_place() };
    }
}

struct BoxedVTable<F, const RUNS_INLINE: bool>(std::marker::PhantomData<F>);

impl<F: FnOnce(), const RUNS_INLINE: bool> BoxedVTable<F, RUNS_INLINE> {
    const VTABLE: TaskVTable = TaskVTable {
        call: Self::call,
        repeat: None,
        drop: Self::drop,
        // Freeing the box itself is the allocator's, not the user's.
        drop_runs_user_code: mem::needs_drop::<F>(),
        runs_inline: RUNS_INLINE,
    };

    /// # Safety
    /// `storage` holds a live `Box<F>` written by [`Task::new`]; it is not used again.
    unsafe fn call(storage: *mut Storage) {
        // SAFETY: per the contract, storage holds a `Box<F>`; reading it takes ownership.
        let function = unsafe { storage.cast::<Box<F>>().read() };
        function();
    }

    /// # Safety
    /// As for `call`.
    unsafe fn drop(storage: *mut Storage) {
        // SAFETY: as in `call`; the box is dropped exactly once here.
        unsafe { storage.cast::<Box<F>>().drop_in_place() };
    }
}

struct RepeatVTable<R>(std::marker::PhantomData<R>);

impl<R: Repeat> RepeatVTable<R> {
    const VTABLE: TaskVTable = TaskVTable {
        call: Self::call,
        repeat: Some(Self::repeat),
        drop: Self::drop,
        drop_runs_user_code: mem::needs_drop::<R>(),
        runs_inline: false,
    };

    /// # Safety
    /// `storage` holds a live `Box<R>` written by [`Task::new_repeating`]; it is not used again.
    unsafe fn call(storage: *mut Storage) {
        // SAFETY: per the contract, storage holds a `Box<R>`; reading it takes ownership.
        let mut repeat = unsafe { storage.cast::<Box<R>>().read() };
        let _ = repeat.run(0, &|| 0);
    }

    /// # Safety
    /// `storage` holds a live `Box<R>`; the returned pointer is valid while the task lives.
    unsafe fn repeat(storage: *mut Storage) -> *mut dyn Repeat {
        // SAFETY: per the contract, storage holds a `Box<R>`; we only borrow through it.
        let boxed = unsafe { &mut *storage.cast::<Box<R>>() };
        &mut **boxed as *mut R as *mut dyn Repeat
    }

    /// # Safety
    /// As for `call`.
    unsafe fn drop(storage: *mut Storage) {
        // SAFETY: as in `call`; the box is dropped exactly once here.
        unsafe { storage.cast::<Box<R>>().drop_in_place() };
    }
}

/// A type-erased task: 24 bytes, no allocation for one-shot closures of up to 16 bytes.
pub(crate) struct Task {
    vtable: &'static TaskVTable,
    storage: Storage,
}

// SAFETY: a Task is only built from an `F: Send` or `R: Send` (see the constructors), and it
// owns that value exclusively, so moving the Task to another thread moves the value there.
unsafe impl Send for Task {}

impl Task {
    fn build<F: FnOnce() + Send + 'static, const RUNS_INLINE: bool>(function: F) -> Task {
        let mut storage = Storage::uninit();
        if fits_inline::<F>() {
            // SAFETY: fits_inline guarantees size and alignment fit the storage.
            unsafe { storage.as_mut_ptr().cast::<F>().write(function) };
            Task {
                vtable: &InlineVTable::<F, RUNS_INLINE>::VTABLE,
                storage,
            }
        } else {
            // SAFETY: a Box is one pointer, which fits the two-word storage.
            unsafe {
                storage
                    .as_mut_ptr()
                    .cast::<Box<F>>()
                    .write(Box::new(function))
            };
            Task {
                vtable: &BoxedVTable::<F, RUNS_INLINE>::VTABLE,
                storage,
            }
        }
    }

    /// A one-shot task run on the executor.
    pub(crate) fn new<F: FnOnce() + Send + 'static>(function: F) -> Task {
        Task::build::<F, false>(function)
    }

    /// A one-shot task run on the shard thread: only for cheap work such as waking a `Waker`.
    pub(crate) fn new_inline<F: FnOnce() + Send + 'static>(function: F) -> Task {
        Task::build::<F, true>(function)
    }

    /// A repeating task (always boxed: it is long-lived).
    pub(crate) fn new_repeating<R: Repeat>(repeat: R) -> Task {
        let mut storage = Storage::uninit();
        // SAFETY: a Box is one pointer, which fits the two-word storage.
        unsafe {
            storage
                .as_mut_ptr()
                .cast::<Box<R>>()
                .write(Box::new(repeat))
        };
        Task {
            vtable: &RepeatVTable::<R>::VTABLE,
            storage,
        }
    }

    /// Whether dropping this task unrun runs code of the user's (and so may panic).
    pub(crate) fn drop_runs_user_code(&self) -> bool {
        self.vtable.drop_runs_user_code
    }

    /// Whether the shard runs this task on its own thread.
    pub(crate) fn runs_inline(&self) -> bool {
        self.vtable.runs_inline
    }

    /// Whether this is a repeating task.
    pub(crate) fn is_repeating(&self) -> bool {
        self.vtable.repeat.is_some()
    }

    /// Runs the task, consuming it (a repeating task runs once and stops).
    pub(crate) fn run(self) {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` holds a live closure written by a constructor; ManuallyDrop makes
        // sure the storage is not dropped again after `call` moves the closure out.
        unsafe { (this.vtable.call)(&mut this.storage) };
    }

    /// One run of a repeating task; see [`Repeat::run`]. `None` for one-shot tasks.
    pub(crate) fn run_repeating(
        &mut self,
        start_nanos: u64,
        now_nanos: &dyn Fn() -> u64,
    ) -> Option<u64> {
        self.as_repeat()?.run(start_nanos, now_nanos)
    }

    /// For a repeating task: restart its schedule from `due_nanos` (see [`Repeat::reanchor`]).
    pub(crate) fn reanchor(&mut self, due_nanos: u64) {
        if let Some(repeat) = self.as_repeat() {
            repeat.reanchor(due_nanos);
        }
    }

    fn as_repeat(&mut self) -> Option<&mut dyn Repeat> {
        let repeat = self.vtable.repeat?;
        // SAFETY: this task is repeating, so its storage holds the `Box<R>` that `repeat`
        // expects; the reference borrows `self` mutably, so it cannot outlive the task.
        Some(unsafe { &mut *repeat(&mut self.storage) })
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        // SAFETY: a Task that is dropped (not run) still holds its closure; this is the only drop.
        unsafe { (self.vtable.drop)(&mut self.storage) };
    }
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("runs_inline", &self.runs_inline())
            .field("repeating", &self.is_repeating())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn size_is_three_words() {
        assert_eq!(mem::size_of::<Task>(), 24);
        assert_eq!(mem::size_of::<Option<Task>>(), 24);
    }

    #[test]
    fn runs_and_drops_inline_and_boxed() {
        let runs = Arc::new(AtomicUsize::new(0));
        let small = {
            let runs = runs.clone();
            Task::new(move || {
                runs.fetch_add(1, Ordering::SeqCst);
            })
        };
        let big_payload = [7u64; 8];
        let big = {
            let runs = runs.clone();
            Task::new_inline(move || {
                runs.fetch_add(big_payload[3] as usize, Ordering::SeqCst);
            })
        };
        assert!(!small.runs_inline() && big.runs_inline());
        small.run();
        big.run();
        assert_eq!(runs.load(Ordering::SeqCst), 8);
        let dropped = Task::new({
            let runs = runs.clone();
            move || drop(runs)
        });
        assert_eq!(Arc::strong_count(&runs), 2);
        drop(dropped);
        assert_eq!(Arc::strong_count(&runs), 1);
    }

    struct Count(Arc<AtomicUsize>, u32);

    impl Repeat for Count {
        fn run(&mut self, start: u64, _now: &dyn Fn() -> u64) -> Option<u64> {
            self.0.fetch_add(1, Ordering::SeqCst);
            self.1 -= 1;
            (self.1 > 0).then_some(start + 10)
        }

        fn reanchor(&mut self, _due: u64) {}
    }

    #[test]
    fn repeating_runs_until_it_stops() {
        let runs = Arc::new(AtomicUsize::new(0));
        let mut task = Task::new_repeating(Count(runs.clone(), 3));
        assert!(task.is_repeating());
        assert_eq!(task.run_repeating(5, &|| 5), Some(15));
        assert_eq!(task.run_repeating(15, &|| 15), Some(25));
        assert_eq!(task.run_repeating(25, &|| 25), None);
        drop(task);
        assert_eq!(Arc::strong_count(&runs), 1);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(Task::new(|| ()).run_repeating(0, &|| 0), None);
    }
}
