//! Process measurements: resident memory and CPU time.

use std::time::Duration;

/// Resident set size in bytes, from `/proc/self/statm` (0 where unavailable).
pub(crate) fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .unwrap_or(0);
    pages * page_size()
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as u64 } else { 4096 }
}

/// User plus system CPU time of the whole process (all threads), from `getrusage`.
pub(crate) fn process_cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` points to writable memory of the right type; RUSAGE_SELF is valid.
    let status = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if status != 0 {
        return Duration::ZERO;
    }
    // SAFETY: getrusage succeeded, so it filled the struct (which was zeroed before anyway).
    let usage = unsafe { usage.assume_init() };
    let micros = |time: libc::timeval| time.tv_sec as u64 * 1_000_000 + time.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

/// Returns freed heap memory to the OS, so that resident memory reflects what is in use
/// rather than what the allocator keeps cached (glibc only; a no-op elsewhere).
pub(crate) fn trim_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Trims the allocator and reads resident memory until two readings 100 ms apart agree to
/// within `tolerance` bytes (the engine may still be applying the last messages), at most
/// `max_wait`. Returns the last reading.
pub(crate) fn settled_rss(tolerance: u64, max_wait: Duration) -> u64 {
    let started = std::time::Instant::now();
    trim_allocator();
    let mut last = rss_bytes();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        trim_allocator();
        let now = rss_bytes();
        if now.abs_diff(last) <= tolerance || started.elapsed() >= max_wait {
            return now;
        }
        last = now;
    }
}
