//! Page storage of the slot table: every `unsafe` of the table lives here (but for the
//! compaction's map, in `retired.rs`).
//!
//! Slots are stored in pages of doubling size that are allocated once and freed only when the
//! table itself is dropped (when the engine and every handle are gone): [`Pages::slot`] never
//! meets a null or freed page. A slot is reused only after its generation is bumped, so a stale
//! reader sees a generation mismatch, never freed memory: this design needs no epoch-based
//! reclamation. The memory of pages can still be given back in place ([`Pages::forget`]), by
//! the [reclaim protocol](super::reclaim) and the [compaction](super::compact).

use super::word::FREE;
use crate::sync::{AtomicPtr, AtomicU64, Ordering};

/// Slots in the first page; page `k` holds `FIRST_PAGE << k`.
const FIRST_PAGE: usize = 64;
const FIRST_PAGE_BITS: u32 = FIRST_PAGE.trailing_zeros();
/// Enough pages for 2^32 slots.
pub(super) const PAGES: usize = 27;

/// One slot: the state word and the deadline tick, side by side (one cache line).
#[repr(align(16))]
pub(crate) struct Slot {
    pub(super) state: AtomicU64,
    pub(super) deadline: AtomicU64,
}

/// Page and offset of a slot index.
pub(super) fn locate(index: u32) -> (usize, usize) {
    let shifted = index as u64 + FIRST_PAGE as u64;
    let page = (63 - shifted.leading_zeros() - FIRST_PAGE_BITS) as usize;
    let offset = (shifted - ((FIRST_PAGE as u64) << page)) as usize;
    (page, offset)
}

pub(super) const fn page_len(page: usize) -> usize {
    FIRST_PAGE << page
}

/// The index of the first slot of page `page`.
pub(super) fn page_start(page: usize) -> u64 {
    ((FIRST_PAGE as u64) << page) - FIRST_PAGE as u64
}

/// The table's pages: page `k` holds `FIRST_PAGE << k` slots; null until first needed.
pub(super) struct Pages([AtomicPtr<Slot>; PAGES]);

impl Pages {
    pub(super) fn new() -> Pages {
        Pages(std::array::from_fn(
            |_| AtomicPtr::new(std::ptr::null_mut()),
        ))
    }

    /// A slot that has been handed out (its page exists).
    #[inline]
    pub(super) fn slot(&self, index: u32) -> &Slot {
        let (page, offset) = locate(index);
        let base = self.0[page].load(Ordering::Acquire);
        debug_assert!(
            !base.is_null(),
            "slot {index} read before its page was allocated"
        );
        // SAFETY: `base` points to a live page of `page_len(page)` slots: pages are installed
        // before any index in them is handed out (see `SlotTable::allocate`), the Acquire load
        // above synchronizes with their Release install, and they are freed only in `Drop`,
        // which takes `&mut self`. `offset < page_len(page)` by construction of `locate`.
        unsafe { &*base.add(offset) }
    }

    /// Slot `index` if its page exists (for a reader that may hold any index, such as the
    /// reclaim's walk over a list that changed under it).
    pub(super) fn slot_if_present(&self, index: u32) -> Option<&Slot> {
        let (page, offset) = locate(index);
        let base = self.0[page].load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: a non-null page is a live page of `page_len(page)` slots (see `slot`), and
        // `offset < page_len(page)` by construction of `locate`.
        Some(unsafe { &*base.add(offset) })
    }

    /// Hints the processor to fetch slot `index`'s line (a slot that has been handed out).
    #[inline]
    pub(super) fn prefetch(&self, index: u32) {
        crate::prefetch::for_read::<Slot>(self.slot(index));
    }

    /// Makes sure page `page` exists.
    pub(super) fn ensure(&self, page: usize) {
        if !self.0[page].load(Ordering::Acquire).is_null() {
            return;
        }
        let fresh = new_page(page_len(page));
        if self.0[page]
            .compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // Another thread installed the page first.
            // SAFETY: `fresh` came from `new_page` with this length just above and was never
            // shared.
            unsafe { free_page(fresh, page_len(page)) };
        }
    }

    /// Gives the memory of the `used` slots of page `page` from slot `offset` back to the
    /// operating system (`madvise(MADV_DONTNEED)` of the whole OS pages inside them): they read
    /// as zeros (FREE words) afterwards and cost no memory until written again. Their content
    /// does not matter (a fresh slot is written whole by `begin`, a stale reader accepts any
    /// FREE word, a retired slot is dead), so a failure only means the memory stays.
    #[cfg(all(unix, not(shardwheel_loom)))]
    pub(super) fn forget(&self, page: usize, offset: usize, used: usize) {
        let base = self.0[page].load(Ordering::Acquire);
        if base.is_null() {
            return;
        }
        // SAFETY: sysconf has no preconditions.
        let os_page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            size if size > 0 => size as usize,
            _ => return,
        };
        let first = base as usize + offset * std::mem::size_of::<Slot>();
        let start = first.next_multiple_of(os_page);
        let end = (first + used * std::mem::size_of::<Slot>()) / os_page * os_page;
        if end <= start {
            return;
        }
        // SAFETY: [start, end) lies inside the page's allocation (rounded inwards to whole OS
        // pages), which stays allocated until `Drop`. The reclaim protocol guarantees that no
        // thread writes to these slots until `ready` passes this page, the compaction's that
        // they are dead (a late write only brings a zero page back); readers only load the
        // words atomically and accept the zeros (FREE) they may read. MADV_DONTNEED changes no
        // mapping, only the content (to zeros, for the private anonymous memory the allocator
        // hands out; other memory keeps its content, which is fine too).
        let result =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        // A failure leaves the memory in place; nothing else depends on it.
        let _ = result;
    }

    /// Elsewhere the memory stays (nothing depends on it being given back).
    #[cfg(all(not(unix), not(shardwheel_loom)))]
    pub(super) fn forget(&self, _page: usize, _offset: usize, _used: usize) {}

    /// Loom: what `madvise` does to the words, as atomic stores the model checker sees, so
    /// that a write it could erase shows up.
    #[cfg(shardwheel_loom)]
    pub(super) fn forget(&self, page: usize, offset: usize, used: usize) {
        let base = self.0[page].load(Ordering::Acquire);
        if base.is_null() {
            return;
        }
        for offset in offset..offset + used {
            // SAFETY: as in `slot_if_present`; `offset + used <= page_len(page)`.
            let slot = unsafe { &*base.add(offset) };
            // Release: a reader of these zeros sees what the caller wrote before (a compaction's
            // moves, whose words read 0 already), as it would after `madvise`'s barriers.
            slot.state.store(0, Ordering::Release);
            slot.deadline.store(0, Ordering::Release);
        }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        for (page, pointer) in self.0.iter_mut().enumerate() {
            let base = pointer.load(Ordering::Acquire);
            if !base.is_null() {
                // SAFETY: a non-null page pointer came from `new_page(page_len(page))` in
                // `ensure`; `&mut self` means no one else can use it any more, and it is freed
                // only here.
                unsafe { free_page(base, page_len(page)) };
            }
        }
    }
}

/// A page of `len` FREE slots, generation 0. Outside loom it is zeroed memory straight from the
/// allocator (all-zero bytes are exactly that state), so the operating system provides its
/// pages only as slots are first used: a large, mostly unused last page costs no memory.
#[cfg(not(shardwheel_loom))]
fn new_page(len: usize) -> *mut Slot {
    let layout = std::alloc::Layout::array::<Slot>(len).expect("page layout fits in memory");
    // SAFETY: the layout has a non-zero size (pages hold at least FIRST_PAGE slots).
    let base = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<Slot>();
    if base.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    const { assert!(FREE == 0, "a zeroed word must be a free slot") };
    base
}

/// Frees a page made by [`new_page`].
///
/// # Safety
/// `base` came from `new_page(len)` and is not used afterwards.
#[cfg(not(shardwheel_loom))]
unsafe fn free_page(base: *mut Slot, len: usize) {
    let layout = std::alloc::Layout::array::<Slot>(len).expect("page layout fits in memory");
    // SAFETY: per the contract, `base` was allocated with this very layout.
    unsafe { std::alloc::dealloc(base.cast::<u8>(), layout) };
}

/// Loom's atomics are not plain memory: build the page word by word.
#[cfg(shardwheel_loom)]
fn new_page(len: usize) -> *mut Slot {
    let page: Box<[Slot]> = (0..len)
        .map(|_| Slot {
            state: AtomicU64::new(FREE),
            deadline: AtomicU64::new(0),
        })
        .collect();
    Box::into_raw(page).cast::<Slot>()
}

/// Frees a page made by [`new_page`].
///
/// # Safety
/// `base` came from `new_page(len)` and is not used afterwards.
#[cfg(shardwheel_loom)]
unsafe fn free_page(base: *mut Slot, len: usize) {
    // SAFETY: per the contract, `base` is a boxed slice of `len` words.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(base, len)) });
}
