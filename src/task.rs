//! [`Task`]: a type-erased `FnOnce() + Send` that stores small closures inline.
//!
//! Most timer tasks capture a few words (an id, an `Arc`, a `Waker`). Boxing each would cost a
//! heap allocation of at least 32 bytes plus a 16-byte fat pointer. A `Task` is 24 bytes: a
//! pointer to a static vtable and two words of inline storage. Closures that fit (at most 16
//! bytes, alignment at most 8) live in those words; bigger ones are boxed and the box pointer
//! lives there instead.

use std::mem::{self, ManuallyDrop, MaybeUninit};

/// Inline storage: two machine words.
type Storage = MaybeUninit<[usize; 2]>;

struct TaskVTable {
    /// Moves the closure out of the storage and calls it.
    call: unsafe fn(*mut Storage),
    /// Drops the closure in place without calling it.
    drop: unsafe fn(*mut Storage),
}

/// Whether a closure of type `F` is stored inline.
const fn fits_inline<F>() -> bool {
    mem::size_of::<F>() <= mem::size_of::<Storage>()
        && mem::align_of::<F>() <= mem::align_of::<Storage>()
}

struct InlineVTable<F>(std::marker::PhantomData<F>);

impl<F: FnOnce()> InlineVTable<F> {
    const VTABLE: TaskVTable = TaskVTable {
        call: Self::call,
        drop: Self::drop,
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

struct BoxedVTable<F>(std::marker::PhantomData<F>);

impl<F: FnOnce()> BoxedVTable<F> {
    const VTABLE: TaskVTable = TaskVTable {
        call: Self::call,
        drop: Self::drop,
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

/// A type-erased one-shot task: `FnOnce() + Send + 'static`, 24 bytes, no allocation for
/// closures of up to 16 bytes.
pub(crate) struct Task {
    vtable: &'static TaskVTable,
    storage: Storage,
}

// SAFETY: a Task is only built from an `F: Send` (see `Task::new`), and it owns that `F`
// exclusively, so moving the Task to another thread moves an `F` there, which `Send` allows.
unsafe impl Send for Task {}

impl Task {
    /// Wraps `function`, inline if it fits in two words.
    pub(crate) fn new<F: FnOnce() + Send + 'static>(function: F) -> Task {
        let mut storage = Storage::uninit();
        if fits_inline::<F>() {
            // SAFETY: fits_inline guarantees size and alignment fit the storage.
            unsafe { storage.as_mut_ptr().cast::<F>().write(function) };
            Task {
                vtable: &InlineVTable::<F>::VTABLE,
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
                vtable: &BoxedVTable::<F>::VTABLE,
                storage,
            }
        }
    }

    /// Runs the task, consuming it.
    pub(crate) fn run(self) {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` holds a live closure written by `new`; ManuallyDrop makes sure the
        // storage is not dropped again after `call` moves the closure out.
        unsafe { (this.vtable.call)(&mut this.storage) };
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
        f.write_str("Task")
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
            Task::new(move || {
                runs.fetch_add(big_payload[3] as usize, Ordering::SeqCst);
            })
        };
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
}
