//! A big test of the standalone wheel: ten million entries over every level and the overflow
//! list, half of them removed by key, the rest expired exactly once and in deadline order.

use std::time::Instant;

use shardwheel::wheel::{EntryKey, Wheel};

/// A deterministic pseudo-random sequence (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Ten million entries: deadlines with a magnitude drawn uniformly from 2^0..2^36 (so every
/// level of the default wheel gets its share), 1% beyond 2^36 (the overflow list, up to 2^41)
/// and a few at the very end of time. Half are removed by key (in a scattered order), then the
/// wheel is advanced in 2^22-tick jumps up to 2^36, in 2^36-tick jumps up to 2^41, and once to
/// `u64::MAX`. Each remaining entry must expire exactly once, in the first jump that reaches its
/// deadline, in nondecreasing deadline order overall.
///
/// Measured in debug (`cargo test --test wheel_big`) on the 2-core machine: about 7 s (10 s
/// while other builds load it), with a peak of about 0.5 GB of memory.
#[test]
fn ten_million_entries() {
    const N: usize = 10_000_000;
    let started = Instant::now();
    let mut rng = Rng(0x5eed);
    let mut wheel: Wheel<u32> = Wheel::new();
    let mut deadlines: Vec<u64> = Vec::with_capacity(N);
    let mut keys: Vec<EntryKey> = Vec::with_capacity(N);
    for i in 0..N {
        let random = rng.next();
        let deadline = if i % 100_000 == 0 {
            u64::MAX - (random & 1)
        } else if i % 100 == 0 {
            (1 << 36) + (random >> 23)
        } else {
            let bits = (random % 37) as u32;
            1 + (rng.next() & ((1u64 << bits) - 1))
        };
        deadlines.push(deadline);
        keys.push(wheel.insert(deadline, i as u32).expect("insert"));
    }
    assert_eq!(wheel.len(), N);
    let inserted = started.elapsed();

    // Remove half, chosen at random, visiting them in a scattered order.
    let mut removed = vec![false; N];
    let mut removed_count = 0;
    let stride = 7_919; // a prime not dividing N: i * stride % N visits every index once
    for step in 0..N {
        let i = step * stride % N;
        if rng.next() & 1 == 1 {
            assert_eq!(wheel.remove(keys[i]), Some(i as u32), "remove of entry {i}");
            removed[i] = true;
            removed_count += 1;
        }
    }
    assert_eq!(wheel.len(), N - removed_count);
    // Removed keys are stale now.
    for i in (0..N).step_by(1_000).filter(|&i| removed[i]) {
        assert_eq!(wheel.remove(keys[i]), None);
    }
    let removed_at = started.elapsed();

    let mut targets: Vec<u64> = (1..=(1u64 << 14)).map(|step| step << 22).collect();
    targets.extend((2..=32u64).map(|step| step << 36));
    targets.push(u64::MAX);
    let mut fired = vec![false; N];
    let mut fired_count = 0usize;
    let mut previous_now = 0u64;
    let mut last_deadline = 0u64;
    for &now in &targets {
        let count = wheel.advance_to(now, |_key, value| {
            let i = value as usize;
            assert!(!removed[i], "removed entry {i} expired");
            assert!(!fired[i], "entry {i} expired twice");
            fired[i] = true;
            let deadline = deadlines[i];
            assert!(
                previous_now < deadline && deadline <= now,
                "entry {i} due at {deadline} expired in the jump ({previous_now}, {now}]"
            );
            assert!(
                deadline >= last_deadline,
                "out of order: {deadline} after {last_deadline}"
            );
            last_deadline = deadline;
            fired_count += 1;
        });
        assert_eq!(wheel.elapsed(), now);
        previous_now = now;
        assert!(count <= N);
    }
    assert_eq!(fired_count, N - removed_count);
    assert!(wheel.is_empty());
    assert_eq!(wheel.next_expiration(), None);
    for i in 0..N {
        assert_ne!(
            fired[i], removed[i],
            "entry {i} neither expired nor removed (or both)"
        );
    }
    eprintln!(
        "ten_million_entries: inserted in {inserted:?}, removed {removed_count} by {removed_at:?}, \
         expired {fired_count}, total {:?}",
        started.elapsed()
    );
}
