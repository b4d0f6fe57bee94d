//! Cache hints: fetch a line before it is read, or take it for writing before it is written.
//! The one home of their `unsafe`.
//!
//! A prefetch changes no memory and never faults, whatever the address: a hint that comes
//! too late or for a line never used costs a little bandwidth, never correctness.
//!
//! Writing ahead matters where one thread writes lines that another thread on another CPU
//! reads (a queue's cells, reused block after block). Each such write first takes the line
//! from the reader's cache, and the next locked instruction waits for that transfer. Taking
//! the line a few writes ahead ([`for_write`]) overlaps the transfers instead of paying them
//! one after another; how much that saves grows with the cross-CPU latency, which on a
//! virtual machine depends on where the host runs its CPUs.

/// Hints that the line holding `address` will soon be read.
#[inline(always)]
pub(crate) fn for_read<T>(address: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of the x86_64 baseline, so the instruction exists; a prefetch only
    // hints the cache and never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// Hints that the line holding `address` will soon be written: the processor fetches it in a
/// state it may write (x86-64 `prefetchw`, where the processor has it; else a read hint).
#[inline(always)]
pub(crate) fn for_write<T>(address: *const T) {
    #[cfg(all(target_arch = "x86_64", not(shardwheel_loom)))]
    if write_hints::supported() {
        // SAFETY: the processor implements `prefetchw` (checked above through CPUID); like
        // every prefetch it never faults, writes no memory and no register, and leaves the
        // flags and the stack alone.
        unsafe {
            std::arch::asm!(
                "prefetchw [{0}]",
                in(reg) address,
                options(nostack, preserves_flags, readonly)
            )
        };
        return;
    }
    for_read(address);
}

#[cfg(all(target_arch = "x86_64", not(shardwheel_loom)))]
mod write_hints {
    use std::sync::atomic::{AtomicU8, Ordering};

    const UNKNOWN: u8 = 0;
    const ABSENT: u8 = 1;
    const PRESENT: u8 = 2;

    /// Whether the processor implements `prefetchw` (CPUID 8000_0001h, ECX bit 8, "PRFCHW" or
    /// "3DNowPrefetch"), asked once.
    static PRFCHW: AtomicU8 = AtomicU8::new(UNKNOWN);

    #[inline(always)]
    pub(super) fn supported() -> bool {
        match PRFCHW.load(Ordering::Relaxed) {
            PRESENT => true,
            ABSENT => false,
            _ => ask(),
        }
    }

    #[cold]
    fn ask() -> bool {
        use std::arch::x86_64::__cpuid;
        // Leaf 8000_0001h exists when the highest extended leaf (leaf 8000_0000h's EAX)
        // reaches it.
        let present =
            __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0;
        PRFCHW.store(if present { PRESENT } else { ABSENT }, Ordering::Relaxed);
        present
    }
}
