//! Unit tests of the standalone [`Wheel`]: every level boundary, wrap-around, slot lists,
//! removal, stale keys, huge jumps, past deadlines, small wheels with a busy overflow list,
//! `next_expiration`, and exactness (an entry fires in the `advance_to` call whose `now` is its
//! deadline).
//!
//! Most tests store each entry's deadline as its value, so a fired value says when it was due.

use super::raw::{LinkStore, Links, RawWheel};
use super::*;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// 64^k.
fn pow64(k: u32) -> u64 {
    1u64 << (6 * k)
}

/// The level boundaries 64^k - 1, 64^k, 64^k + 1 for k = 1..=6.
fn boundaries() -> Vec<u64> {
    (1..=6)
        .flat_map(|k| [pow64(k) - 1, pow64(k), pow64(k) + 1])
        .collect()
}

/// A wheel with `levels` levels, or the default wheel for `None`, moved (empty) to `start`.
fn wheel_at<T>(levels: Option<usize>, start: u64) -> Wheel<T> {
    let mut wheel = match levels {
        None => Wheel::new(),
        Some(levels) => Wheel::with_levels(levels).expect("valid level count"),
    };
    assert_eq!(
        wheel.advance_to(start, |_, _| panic!("an empty wheel fired")),
        0
    );
    assert_eq!(wheel.elapsed(), start);
    wheel
}

/// The level counts worth testing: the default wheel, and 1, 2, 3 and 11 levels.
fn level_choices() -> [Option<usize>; 5] {
    [None, Some(1), Some(2), Some(3), Some(MAX_LEVELS)]
}

/// Advances to `now`, returning what was handed out, in order. Checks the returned count.
fn advance<T>(wheel: &mut Wheel<T>, now: u64) -> Vec<(EntryKey, T)> {
    let mut fired = Vec::new();
    let count = wheel.advance_to(now, |key, value| fired.push((key, value)));
    assert_eq!(
        count,
        fired.len(),
        "advance_to's count disagrees with its callbacks"
    );
    fired
}

/// Advances to `now` and returns the fired values, in order.
fn advance_values<T>(wheel: &mut Wheel<T>, now: u64) -> Vec<T> {
    advance(wheel, now)
        .into_iter()
        .map(|(_, value)| value)
        .collect()
}

/// Advances to `now`, asserting that nothing fires.
fn advance_quiet(wheel: &mut Wheel<u64>, now: u64) {
    let fired = advance_values(wheel, now);
    assert!(fired.is_empty(), "advancing to {now} fired {fired:?}");
}

/// Advances one tick at a time up to `to`, asserting that every entry (whose value is its
/// deadline) fires in the call whose `now` equals its deadline. Returns the fired values.
fn walk(wheel: &mut Wheel<u64>, to: u64) -> Vec<u64> {
    let mut all = Vec::new();
    let mut now = wheel.elapsed();
    while now < to {
        now += 1;
        for value in advance_values(wheel, now) {
            assert_eq!(value, now, "the entry due at {value} fired at tick {now}");
            all.push(value);
        }
        assert_eq!(wheel.elapsed(), now);
    }
    all
}

/// Walks tick by tick through a window of `window` ticks on each side of every deadline, and
/// jumps (asserting that nothing fires) over the stretches between windows, until all of
/// `deadlines` (the pending entries' deadlines, ascending or not) have fired exactly once at
/// their tick.
fn walk_windows(wheel: &mut Wheel<u64>, deadlines: &[u64], window: u64) {
    let mut expected = deadlines.to_vec();
    expected.sort_unstable();
    let mut fired = Vec::new();
    let mut distinct = expected.clone();
    distinct.dedup();
    for &deadline in &distinct {
        if deadline <= wheel.elapsed() {
            continue;
        }
        let quiet_until = deadline.saturating_sub(window);
        if quiet_until > wheel.elapsed() {
            advance_quiet(wheel, quiet_until);
        }
        fired.extend(walk(wheel, deadline.saturating_add(window)));
    }
    assert_eq!(
        fired, expected,
        "fired entries differ from the inserted ones"
    );
    assert_eq!(wheel.len(), 0);
    assert!(wheel.is_empty());
    assert_eq!(wheel.next_expiration(), None);
}

/// Repeatedly advances to `next_expiration()`, checking that it never lies before the wheel's
/// tick nor after the earliest pending deadline, and that whatever fires is due exactly then.
/// Returns the fired values in order.
fn follow_next_expiration(wheel: &mut Wheel<u64>) -> Vec<u64> {
    let mut fired = Vec::new();
    let mut steps = 0usize;
    while let Some(next) = wheel.next_expiration() {
        steps += 1;
        assert!(steps < 1_000_000, "next_expiration does not make progress");
        assert!(
            next >= wheel.elapsed(),
            "next_expiration {next} before the tick {}",
            wheel.elapsed()
        );
        // Nothing may be due before `next`.
        if next > wheel.elapsed() {
            advance_quiet(wheel, next - 1);
        }
        for value in advance_values(wheel, next) {
            assert_eq!(value, next, "entry due at {value} fired at {next}");
            fired.push(value);
        }
    }
    assert!(wheel.is_empty());
    fired
}

// ----------------------------------------------------------------------------------------
// Construction
// ----------------------------------------------------------------------------------------

#[test]
fn invalid_level_counts_are_rejected() {
    for levels in [0, MAX_LEVELS + 1, 12, 64, usize::MAX] {
        let error = Wheel::<u64>::with_levels(levels).expect_err("invalid level count accepted");
        assert_eq!(error, WheelError::InvalidLevels { levels });
        assert!(error.to_string().contains(&levels.to_string()), "{error}");
    }
    assert_eq!(
        Wheel::<u64>::with_levels(0).unwrap_err(),
        WheelError::InvalidLevels { levels: 0 }
    );
    assert_eq!(
        Wheel::<u64>::with_levels(12).unwrap_err(),
        WheelError::InvalidLevels { levels: 12 }
    );
    for levels in 1..=MAX_LEVELS {
        let wheel = Wheel::<u64>::with_levels(levels).expect("valid level count rejected");
        assert_eq!(
            (wheel.len(), wheel.elapsed(), wheel.next_expiration()),
            (0, 0, None)
        );
    }
    assert_eq!(DEFAULT_LEVELS, 6);
    assert_eq!(SLOTS_PER_LEVEL, 64);
    let wheel = Wheel::<u64>::default();
    assert!(wheel.is_empty());
    let debug = format!("{wheel:?}");
    assert!(
        debug.contains("elapsed") && debug.contains("len"),
        "{debug}"
    );
}

// ----------------------------------------------------------------------------------------
// Level boundaries
// ----------------------------------------------------------------------------------------

#[test]
fn each_level_boundary_alone_from_tick_zero() {
    for levels in level_choices() {
        for deadline in boundaries() {
            let mut wheel = wheel_at(levels, 0);
            let key = wheel.insert(deadline, deadline).unwrap();
            assert_eq!(wheel.deadline(key), Some(deadline));
            let next = wheel.next_expiration().unwrap();
            assert!(
                next <= deadline,
                "{levels:?}: next_expiration {next} after deadline {deadline}"
            );
            advance_quiet(&mut wheel, deadline - 1);
            assert_eq!(wheel.len(), 1, "{levels:?}: entry {deadline} lost");
            assert_eq!(wheel.next_expiration(), Some(deadline), "{levels:?}");
            assert_eq!(
                advance_values(&mut wheel, deadline),
                [deadline],
                "{levels:?}"
            );
            assert!(wheel.is_empty());
            assert_eq!(wheel.remove(key), None);
        }
    }
}

#[test]
fn all_level_boundaries_together_from_tick_zero() {
    for levels in level_choices() {
        let mut wheel = wheel_at(levels, 0);
        let deadlines = boundaries();
        for &deadline in &deadlines {
            wheel.insert(deadline, deadline).unwrap();
        }
        assert_eq!(wheel.len(), deadlines.len());
        assert_eq!(wheel.next_expiration(), Some(63), "{levels:?}");
        walk_windows(&mut wheel, &deadlines, 70);

        // The same again in one jump, and by following next_expiration.
        let mut wheel = wheel_at(levels, 0);
        for &deadline in deadlines.iter().rev() {
            wheel.insert(deadline, deadline).unwrap();
        }
        assert_eq!(
            advance_values(&mut wheel, u64::MAX),
            deadlines,
            "{levels:?}"
        );
        let mut wheel = wheel_at(levels, 0);
        for &deadline in &deadlines {
            wheel.insert(deadline, deadline).unwrap();
        }
        assert_eq!(follow_next_expiration(&mut wheel), deadlines, "{levels:?}");
    }
}

/// Non-zero starting ticks: arbitrary bits in every group, and one tick before each boundary
/// (so a deadline one tick ahead sits several levels up).
fn interesting_starts() -> Vec<u64> {
    let mut starts = vec![
        1,
        5,
        63,
        64,
        65,
        100,
        0x0123_4567_89ab,
        0x5555_5555_5555,
        3 * pow64(6) + 12_345,
    ];
    for k in 1..=6 {
        starts.push(pow64(k) - 1);
        starts.push(pow64(k));
        starts.push(7 * pow64(k) - 1);
    }
    starts
}

#[test]
fn level_boundaries_from_non_zero_ticks() {
    for levels in level_choices() {
        for start in interesting_starts() {
            // Deadlines relative to the start...
            let mut deadlines: Vec<u64> = (1..=6)
                .flat_map(|k| [start + pow64(k) - 1, start + pow64(k), start + pow64(k) + 1])
                .collect();
            // ...and the next aligned multiples of 64^k, +-1, seen from the start.
            for k in 1..=6 {
                let aligned = (start / pow64(k) + 1) * pow64(k);
                deadlines.extend([aligned - 1, aligned, aligned + 1]);
            }
            deadlines.retain(|&deadline| deadline > start);
            let mut wheel = wheel_at(levels, start);
            for &deadline in &deadlines {
                wheel.insert(deadline, deadline).unwrap();
            }
            assert_eq!(wheel.len(), deadlines.len());
            walk_windows(&mut wheel, &deadlines, 70);

            let mut wheel = wheel_at(levels, start);
            for &deadline in &deadlines {
                wheel.insert(deadline, deadline).unwrap();
            }
            let mut sorted = deadlines.clone();
            sorted.sort_unstable();
            assert_eq!(
                follow_next_expiration(&mut wheel),
                sorted,
                "{levels:?} from {start}"
            );
        }
    }
}

#[test]
fn one_boundary_at_a_time_from_non_zero_ticks() {
    for levels in [None, Some(1), Some(2)] {
        for start in interesting_starts() {
            for k in 1..=6 {
                for deadline in [start + pow64(k) - 1, start + pow64(k), start + pow64(k) + 1] {
                    let mut wheel = wheel_at(levels, start);
                    wheel.insert(deadline, deadline).unwrap();
                    advance_quiet(&mut wheel, deadline - 1);
                    assert_eq!(
                        advance_values(&mut wheel, deadline),
                        [deadline],
                        "{levels:?} from {start}"
                    );
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------------------
// Exactness tick by tick
// ----------------------------------------------------------------------------------------

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

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

#[test]
fn tick_by_tick_every_entry_fires_at_its_own_tick() {
    // Every tick of the first two level-3 blocks (2 * 64^3 ticks), with entries on each
    // boundary of levels 0..=2 and at random ticks, some inserted along the way.
    let end = 2 * pow64(3) + 100;
    for levels in [None, Some(1), Some(2), Some(3)] {
        let mut rng = Rng(42);
        let mut wheel = wheel_at(levels, 0);
        let mut expected = Vec::new();
        for k in 1..=3 {
            for multiple in [1, 2, 63] {
                let boundary = multiple * pow64(k);
                for deadline in [boundary - 1, boundary, boundary + 1] {
                    if deadline < end {
                        wheel.insert(deadline, deadline).unwrap();
                        expected.push(deadline);
                    }
                }
            }
        }
        for _ in 0..2_000 {
            let deadline = 1 + rng.below(end - 1);
            wheel.insert(deadline, deadline).unwrap();
            expected.push(deadline);
        }
        let mut fired = Vec::new();
        let mut now = 0;
        while now < end {
            now += 1;
            for value in advance_values(&mut wheel, now) {
                assert_eq!(
                    value, now,
                    "{levels:?}: the entry due at {value} fired at tick {now}"
                );
                fired.push(value);
            }
            // Insert along the way: some a little ahead, some far ahead.
            if now % 97 == 0 {
                for delta in [1, 63, 64, 65, 4095, 4096, 4097, rng.below(100_000) + 1] {
                    let deadline = now + delta;
                    if deadline < end {
                        wheel.insert(deadline, deadline).unwrap();
                        expected.push(deadline);
                    }
                }
            }
        }
        expected.sort_unstable();
        assert_eq!(fired, expected, "{levels:?}");
        assert!(wheel.is_empty());
    }
}

// ----------------------------------------------------------------------------------------
// Wrap-around
// ----------------------------------------------------------------------------------------

#[test]
fn tick_crosses_block_boundaries_with_entries_on_both_sides() {
    for levels in level_choices() {
        for k in 1..=7u32 {
            for multiple in [1u64, 5, 63] {
                let Some(boundary) = pow64(k).checked_mul(multiple) else {
                    continue;
                };
                let start = boundary - 3;
                let mut wheel = wheel_at(levels, start);
                let mut deadlines = vec![
                    boundary - 2,
                    boundary - 1,
                    boundary,
                    boundary + 1,
                    boundary + 63,
                ];
                deadlines.extend([
                    boundary + 64,
                    boundary + 65,
                    boundary + 4096,
                    boundary + pow64(k),
                ]);
                for &deadline in &deadlines {
                    wheel.insert(deadline, deadline).unwrap();
                }
                let mut fired = walk(&mut wheel, boundary - 1);
                // One tick before the boundary, add more entries just across it.
                for deadline in [boundary, boundary + 2, boundary + 64] {
                    wheel.insert(deadline, deadline).unwrap();
                    deadlines.push(deadline);
                }
                fired.extend(walk(&mut wheel, boundary + 200));
                let rest: Vec<u64> = deadlines
                    .iter()
                    .copied()
                    .filter(|&d| d > boundary + 200)
                    .collect();
                walk_windows(&mut wheel, &rest, 70);
                fired.extend(rest);
                fired.sort_unstable();
                deadlines.sort_unstable();
                assert_eq!(fired, deadlines, "{levels:?} around {boundary}");
            }
        }
    }
}

#[test]
fn wrap_around_the_top_of_the_default_wheel_and_the_end_of_time() {
    for levels in level_choices() {
        // Across 2^36, where the default wheel's levels end.
        let top = pow64(6);
        let mut wheel = wheel_at(levels, top - 3);
        let deadlines = [
            top - 2,
            top - 1,
            top,
            top + 1,
            top + 64,
            top + pow64(6) - 1,
            top + pow64(6),
        ];
        for &deadline in &deadlines {
            wheel.insert(deadline, deadline).unwrap();
        }
        walk_windows(&mut wheel, &deadlines, 70);

        // The last ticks of time.
        let mut wheel = wheel_at(levels, u64::MAX - 70);
        let deadlines: Vec<u64> = (u64::MAX - 69..=u64::MAX).collect();
        for &deadline in deadlines.iter().rev() {
            wheel.insert(deadline, deadline).unwrap();
        }
        assert_eq!(walk(&mut wheel, u64::MAX), deadlines, "{levels:?}");
        assert_eq!(wheel.elapsed(), u64::MAX);
        // At the end of time a new entry (at or before u64::MAX) still expires.
        wheel.insert(u64::MAX, 1).unwrap();
        wheel.insert(3, 2).unwrap();
        let mut fired = advance_values(&mut wheel, u64::MAX);
        fired.sort_unstable();
        assert_eq!(fired, [1, 2]);
    }
}

// ----------------------------------------------------------------------------------------
// Slot lists
// ----------------------------------------------------------------------------------------

#[test]
fn all_entries_in_one_slot_fire_together() {
    for levels in level_choices() {
        // Level 0, and slots of levels 1, 2, 3 (and overflow for small wheels).
        for deadline in [7, 100, 100_000, 10_000_000, pow64(6) + 3] {
            let mut wheel = wheel_at(levels, 0);
            let keys: Vec<EntryKey> = (0..500)
                .map(|_| wheel.insert(deadline, deadline).unwrap())
                .collect();
            assert_eq!(wheel.len(), 500);
            advance_quiet(&mut wheel, deadline - 1);
            assert_eq!(wheel.len(), 500);
            let fired = advance(&mut wheel, deadline);
            assert_eq!(fired.len(), 500, "{levels:?} at {deadline}");
            assert!(fired.iter().all(|&(_, value)| value == deadline));
            let mut fired_keys: Vec<EntryKey> = fired.iter().map(|&(key, _)| key).collect();
            fired_keys.sort_unstable();
            let mut sorted_keys = keys.clone();
            sorted_keys.sort_unstable();
            assert_eq!(fired_keys, sorted_keys);
            assert!(wheel.is_empty());
        }
    }
}

#[test]
fn distinct_deadlines_in_one_higher_slot_fire_one_by_one() {
    for levels in level_choices() {
        // From tick 0: 64..128 share level 1's slot 1; 5 * 4096.. share level 2's slot 5.
        let mut wheel = wheel_at(levels, 0);
        let deadlines: Vec<u64> = (64..128)
            .chain((0..200).map(|i| 5 * 4096 + i * 20))
            .collect();
        for &deadline in deadlines.iter().rev() {
            wheel.insert(deadline, deadline).unwrap();
        }
        let fired = walk(&mut wheel, 6 * 4096);
        assert_eq!(fired, deadlines);
    }
}

#[test]
fn slot_lists_are_newest_first() {
    // The removal tests below name the positions of a slot's list; this checks the assumption
    // that a slot's list is kept newest first (insert pushes at the head), as `drain` walks it.
    let mut wheel = Wheel::new();
    for value in 0..5u64 {
        wheel.insert(100, value).unwrap();
    }
    let mut drained = Vec::new();
    wheel.drain(|_, value| drained.push(value));
    assert_eq!(drained, [4, 3, 2, 1, 0]);
}

/// Inserts `deadlines.len()` entries into one slot, removes those named by `remove_mask` (bit i:
/// the i-th inserted; as the list is newest first, bit 0 is the tail and the last bit the head),
/// in the given order, then checks that the rest fire exactly at their ticks.
fn remove_from_one_slot(
    levels: Option<usize>,
    start: u64,
    deadlines: &[u64],
    remove_mask: u32,
    reverse: bool,
) {
    let mut wheel = wheel_at(levels, start);
    let keys: Vec<EntryKey> = deadlines
        .iter()
        .map(|&deadline| wheel.insert(deadline, deadline).unwrap())
        .collect();
    let mut order: Vec<usize> = (0..deadlines.len())
        .filter(|i| remove_mask & (1 << i) != 0)
        .collect();
    if reverse {
        order.reverse();
    }
    for &i in &order {
        assert_eq!(
            wheel.remove(keys[i]),
            Some(deadlines[i]),
            "mask {remove_mask:b}"
        );
        assert_eq!(wheel.remove(keys[i]), None, "removed twice");
        assert_eq!(wheel.deadline(keys[i]), None);
    }
    let remaining: Vec<u64> = (0..deadlines.len())
        .filter(|i| remove_mask & (1 << i) == 0)
        .map(|i| deadlines[i])
        .collect();
    assert_eq!(wheel.len(), remaining.len());
    if remaining.is_empty() {
        // The slot's occupancy bit was cleared.
        assert_eq!(wheel.next_expiration(), None, "mask {remove_mask:b}");
    }
    for (i, &key) in keys.iter().enumerate() {
        if remove_mask & (1 << i) == 0 {
            assert_eq!(wheel.deadline(key), Some(deadlines[i]));
        }
    }
    walk_windows(&mut wheel, &remaining, 70);
}

#[test]
fn removing_head_middle_and_tail_of_a_slot_list() {
    let cases: [(u64, Vec<u64>); 5] = [
        (0, vec![9; 5]),                         // one level-0 slot, one tick
        (0, vec![5000; 5]),                      // one level-2 slot, one tick
        (0, vec![4096, 4200, 5000, 8000, 8191]), // one level-2 slot, distinct ticks
        (1000, vec![1000 + 262_144 * 3 + 7; 5]), // a level-3 slot from a non-zero tick
        (
            0,
            vec![pow64(6) + 1, pow64(6) + 2, pow64(6), pow64(7), u64::MAX],
        ), // overflow (default)
    ];
    for levels in [None, Some(1), Some(2)] {
        for (start, deadlines) in &cases {
            for mask in 0..(1u32 << deadlines.len()) {
                for reverse in [false, true] {
                    remove_from_one_slot(levels, *start, deadlines, mask, reverse);
                }
            }
        }
    }
}

#[test]
fn removing_the_only_entry_of_a_slot_moves_next_expiration_on() {
    let mut wheel = Wheel::new();
    let first = wheel.insert(10, 10).unwrap();
    wheel.insert(20, 20).unwrap();
    assert_eq!(wheel.next_expiration(), Some(10));
    assert_eq!(wheel.remove(first), Some(10));
    assert_eq!(wheel.next_expiration(), Some(20));
    assert_eq!(advance_values(&mut wheel, 20), [20]);
}

#[test]
fn re_insertion_after_removal_and_after_expiry() {
    for levels in level_choices() {
        let mut wheel = wheel_at(levels, 500);
        let old = wheel.insert(5000, 5000).unwrap();
        assert_eq!(wheel.remove(old), Some(5000));
        let new = wheel.insert(5000, 5000).unwrap();
        assert_ne!(old, new);
        assert_eq!(wheel.remove(old), None);
        assert_eq!(wheel.len(), 1);
        // Re-insert once more at a different deadline in another level.
        assert_eq!(wheel.remove(new), Some(5000));
        let moved = wheel.insert(70_000, 70_000).unwrap();
        assert_eq!(wheel.remove(new), None);
        walk_windows(&mut wheel, &[70_000], 70);
        assert_eq!(wheel.remove(moved), None);

        // After expiry, the same deadline again (now in the past: fires at the next advance).
        let again = wheel.insert(70_000, 70_000).unwrap();
        assert_eq!(wheel.deadline(again), Some(wheel.elapsed()));
        let now = wheel.elapsed();
        assert_eq!(advance_values(&mut wheel, now), [70_000]);

        // Many rounds through the same slab entries.
        let mut wheel = wheel_at(levels, 0);
        for round in 0..100u64 {
            let keys: Vec<EntryKey> = (0..10)
                .map(|i| wheel.insert(round * 1000 + 500 + i, i).unwrap())
                .collect();
            for &key in keys.iter().step_by(2) {
                assert!(wheel.remove(key).is_some());
            }
            let fired = advance_values(&mut wheel, round * 1000 + 999);
            assert_eq!(fired, [1, 3, 5, 7, 9], "round {round}");
        }
        assert!(
            wheel.slab.entries.len() <= 10,
            "the slab does not reuse freed entries"
        );
    }
}

// ----------------------------------------------------------------------------------------
// Stale keys
// ----------------------------------------------------------------------------------------

#[test]
fn stale_key_of_an_expired_entry_never_touches_the_new_one_in_the_same_slot() {
    for levels in level_choices() {
        let mut wheel = wheel_at(levels, 0);
        let old = wheel.insert(10, 1).unwrap();
        assert_eq!(advance_values(&mut wheel, 10), [1]);
        // Same slab entry, same slot (level 0, slot 10 again one block later).
        let new = wheel.insert(74, 2).unwrap();
        assert_eq!(new.index, old.index, "the slab entry was not reused");
        assert_ne!(new.generation, old.generation);
        assert_eq!(wheel.remove(old), None);
        assert_eq!(wheel.deadline(old), None);
        assert_eq!(wheel.len(), 1);
        assert_eq!(wheel.deadline(new), Some(74));
        advance_quiet_any(&mut wheel, 73);
        assert_eq!(advance_values(&mut wheel, 74), [2]);
        assert_eq!(wheel.remove(new), None);
    }
}

fn advance_quiet_any<T: std::fmt::Debug>(wheel: &mut Wheel<T>, now: u64) {
    let fired = advance_values(wheel, now);
    assert!(fired.is_empty(), "advancing to {now} fired {fired:?}");
}

#[test]
fn stale_key_of_a_removed_entry_never_touches_the_new_one_in_the_same_slot() {
    for levels in level_choices() {
        let mut wheel = wheel_at(levels, 3);
        let old = wheel.insert(100_000, "old").unwrap();
        let other = wheel.insert(100_000, "other").unwrap();
        assert_eq!(wheel.remove(old), Some("old"));
        let new = wheel.insert(100_000, "new").unwrap();
        assert_eq!(new.index, old.index);
        assert_eq!(wheel.remove(old), None);
        assert_eq!(wheel.remove(old), None);
        assert_eq!(wheel.len(), 2);
        assert_eq!(wheel.deadline(new), Some(100_000));
        advance_quiet_any(&mut wheel, 99_999);
        let mut fired = advance(&mut wheel, 100_000);
        fired.sort_by_key(|&(key, _)| key);
        let mut expected = vec![(new, "new"), (other, "other")];
        expected.sort_by_key(|&(key, _)| key);
        assert_eq!(fired, expected);
        // Keys handed to the callback are the insert keys, now stale.
        assert_eq!(wheel.remove(new), None);
        assert_eq!(wheel.remove(other), None);
    }
}

#[test]
fn keys_from_nowhere_and_drained_keys_are_stale() {
    let mut wheel = Wheel::new();
    assert_eq!(
        wheel.remove(EntryKey {
            index: 0,
            generation: 0
        }),
        None
    );
    assert_eq!(
        wheel.remove(EntryKey {
            index: 12345,
            generation: 0
        }),
        None
    );
    let a = wheel.insert(5, 'a').unwrap();
    assert_eq!(
        wheel.remove(EntryKey {
            index: a.index,
            generation: a.generation + 1
        }),
        None
    );
    assert_eq!(wheel.len(), 1);
    let b = wheel.insert(pow64(6) + 9, 'b').unwrap(); // overflow
    let c = wheel.insert(70_000, 'c').unwrap();
    let mut drained = Vec::new();
    wheel.drain(|key, value| drained.push((key, value)));
    drained.sort_unstable();
    let mut expected = vec![(a, 'a'), (b, 'b'), (c, 'c')];
    expected.sort_unstable();
    assert_eq!(drained, expected);
    assert!(wheel.is_empty());
    assert_eq!(wheel.next_expiration(), None);
    for key in [a, b, c] {
        assert_eq!(wheel.remove(key), None);
        assert_eq!(wheel.deadline(key), None);
    }
    // The wheel still works after a drain, and the tick did not move.
    assert_eq!(wheel.elapsed(), 0);
    wheel.insert(5, 'd').unwrap();
    assert_eq!(advance_values(&mut wheel, u64::MAX), ['d']);
}

// ----------------------------------------------------------------------------------------
// Huge jumps
// ----------------------------------------------------------------------------------------

#[test]
fn empty_wheel_jumps_at_once() {
    for levels in level_choices() {
        let mut wheel = wheel_at::<u64>(levels, 0);
        let started = Instant::now();
        assert_eq!(wheel.advance_to(1 << 40, |_, _| unreachable!()), 0);
        assert_eq!(wheel.elapsed(), 1 << 40);
        // Ten thousand more jumps of 2^40 ticks: each is O(levels), not O(ticks).
        for i in 2..10_002u64 {
            assert_eq!(wheel.advance_to(i << 40, |_, _| unreachable!()), 0);
        }
        assert_eq!(wheel.elapsed(), 10_001 << 40);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "empty jumps took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn one_jump_to_the_end_of_time_hands_out_everything_in_order() {
    let deadlines = [1, 1 << 20, (1 << 36) + 5, u64::MAX - 1, u64::MAX];
    let orders: [[usize; 5]; 3] = [[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 4, 0, 3, 1]];
    for levels in [None].into_iter().chain((1..=MAX_LEVELS).map(Some)) {
        for order in orders {
            let mut wheel = wheel_at(levels, 0);
            for i in order {
                wheel.insert(deadlines[i], deadlines[i]).unwrap();
            }
            assert_eq!(wheel.advance_to(u64::MAX, |_, _| {}), 5);
            assert!(wheel.is_empty());

            let mut wheel = wheel_at(levels, 0);
            for i in order {
                wheel.insert(deadlines[i], deadlines[i]).unwrap();
            }
            assert_eq!(
                advance_values(&mut wheel, u64::MAX),
                deadlines,
                "{levels:?} {order:?}"
            );
            assert_eq!(wheel.elapsed(), u64::MAX);
            assert_eq!(wheel.next_expiration(), None);
        }
    }
}

#[test]
fn jumps_over_many_entries_hand_out_exactly_the_due_ones_in_order() {
    for levels in level_choices() {
        let mut rng = Rng(7);
        let mut wheel = wheel_at(levels, 0);
        let mut pending: Vec<u64> = Vec::new();
        for _ in 0..5_000 {
            // Spread over all magnitudes: 2^0 .. 2^64.
            let bits = rng.below(65) as u32;
            let deadline = if bits == 64 {
                rng.next()
            } else {
                rng.next() & ((1u64 << bits) - 1)
            };
            wheel.insert(deadline, deadline).unwrap();
            pending.push(deadline.max(wheel.elapsed()));
        }
        pending.sort_unstable();
        let mut targets = vec![
            0,
            1,
            1 << 10,
            1 << 20,
            (1 << 36) - 1,
            1 << 36,
            1 << 50,
            u64::MAX - 1,
        ];
        targets.push(u64::MAX);
        for target in targets {
            let fired = advance_values(&mut wheel, target);
            let due = pending.partition_point(|&deadline| deadline <= target);
            let expected: Vec<u64> = pending.drain(..due).collect();
            assert_eq!(fired, expected, "{levels:?}: jump to {target}");
            assert_eq!(wheel.len(), pending.len());
        }
        assert!(wheel.is_empty());
    }
}

// ----------------------------------------------------------------------------------------
// Past deadlines
// ----------------------------------------------------------------------------------------

#[test]
fn past_deadlines_expire_at_the_next_advance() {
    for levels in level_choices() {
        for start in [1, 1000, pow64(6) + 17, u64::MAX - 1, u64::MAX] {
            let mut wheel = wheel_at(levels, start);
            let past = wheel.insert(start - 1, 1).unwrap();
            let zero = wheel.insert(0, 2).unwrap();
            let now = wheel.insert(start, 3).unwrap();
            for key in [past, zero, now] {
                assert_eq!(
                    wheel.deadline(key),
                    Some(start),
                    "clamped to the current tick"
                );
            }
            assert_eq!(wheel.next_expiration(), Some(start));
            // Even advancing to the current tick hands them out.
            let mut fired = advance_values(&mut wheel, start);
            fired.sort_unstable();
            assert_eq!(fired, [1, 2, 3], "{levels:?} from {start}");
            assert_eq!(wheel.elapsed(), start);
            assert!(wheel.is_empty());
        }
        // A past entry comes out before entries due later in the same advance.
        let mut wheel = wheel_at(levels, 1000);
        wheel.insert(1001, 1001).unwrap();
        wheel.insert(10, 10).unwrap();
        wheel.insert(5000, 5000).unwrap();
        assert_eq!(advance_values(&mut wheel, 6000), [10, 1001, 5000]);
    }
}

#[test]
fn advancing_backwards_does_not_move_time_back() {
    let mut wheel = wheel_at(None, 1000);
    wheel.insert(1500, 1500).unwrap();
    advance_quiet(&mut wheel, 10);
    assert_eq!(wheel.elapsed(), 1000);
    assert_eq!(wheel.len(), 1);
    advance_quiet(&mut wheel, 1499);
    assert_eq!(advance_values(&mut wheel, 1500), [1500]);
}

/// `Wheel::insert` promises that "a deadline at or before the current tick expires at the next
/// `advance_to`": that includes an `advance_to(now)` with `now` before `elapsed()`, which counts
/// as the current tick (and does not move time back).
#[test]
fn past_deadline_fires_even_when_advancing_to_an_earlier_tick() {
    for levels in level_choices() {
        let mut wheel = wheel_at(levels, 1000);
        wheel.insert(10, 10).unwrap();
        wheel.insert(1000, 1000).unwrap();
        wheel.insert(1001, 1001).unwrap();
        let mut fired = advance_values(&mut wheel, 999);
        fired.sort_unstable();
        assert_eq!(fired, [10, 1000], "{levels:?}");
        assert_eq!(wheel.elapsed(), 1000);
        assert_eq!(wheel.len(), 1);
        wheel.insert(0, 0).unwrap();
        assert_eq!(advance_values(&mut wheel, 0), [0]);
        assert_eq!(advance_values(&mut wheel, 1001), [1001]);
    }
}

// ----------------------------------------------------------------------------------------
// Small wheels: the overflow list
// ----------------------------------------------------------------------------------------

#[test]
fn small_wheels_overflow_fires_exactly_tick_by_tick() {
    for levels in [1, 2] {
        let top = pow64(levels as u32);
        let end = 3 * 4096 + 200;
        let mut wheel = wheel_at(Some(levels), 0);
        let mut expected = Vec::new();
        // Far beyond the top level: multiples of the top span +-1, and scattered ticks.
        for multiple in 1..(end / top) {
            for deadline in [multiple * top - 1, multiple * top, multiple * top + 1] {
                wheel.insert(deadline, deadline).unwrap();
                expected.push(deadline);
            }
        }
        let mut rng = Rng(levels as u64);
        for _ in 0..1_000 {
            let deadline = 1 + rng.below(end - 1);
            wheel.insert(deadline, deadline).unwrap();
            expected.push(deadline);
        }
        // And some so far ahead that they stay in overflow throughout.
        let far = [1 << 30, 1 << 40, (1 << 40) + 1, u64::MAX - 64, u64::MAX];
        for deadline in far {
            wheel.insert(deadline, deadline).unwrap();
        }
        let mut fired = Vec::new();
        let mut now = 0;
        while now < end {
            now += 1;
            for value in advance_values(&mut wheel, now) {
                assert_eq!(
                    value, now,
                    "{levels} levels: the entry due at {value} fired at tick {now}"
                );
                fired.push(value);
            }
            // Keep feeding the overflow list while walking.
            if now % 61 == 0 {
                for delta in [top - 1, top, top + 1, 2 * top + 5, rng.below(5_000) + 1] {
                    let deadline = now + delta;
                    if deadline <= end {
                        wheel.insert(deadline, deadline).unwrap();
                        expected.push(deadline);
                    }
                }
            }
        }
        expected.sort_unstable();
        assert_eq!(fired, expected, "{levels} levels");
        assert_eq!(wheel.len(), far.len());
        walk_windows(&mut wheel, &far, 130);
    }
}

#[test]
fn small_wheels_overflow_in_one_big_jump() {
    for levels in [1, 2] {
        let mut rng = Rng(100 + levels as u64);
        let mut wheel = wheel_at(Some(levels), 12_345);
        let mut expected = Vec::new();
        for _ in 0..3_000 {
            let deadline = match rng.below(4) {
                0 => 12_345 + rng.below(100_000),
                1 => 12_345 + rng.below(1 << 40),
                2 => rng.next(),
                _ => u64::MAX - rng.below(3),
            };
            wheel.insert(deadline, deadline).unwrap();
            expected.push(deadline.max(12_345));
        }
        expected.sort_unstable();
        let middle = expected[1_500];
        let fired = advance_values(&mut wheel, middle);
        let due = expected.partition_point(|&deadline| deadline <= middle);
        assert_eq!(fired, expected[..due], "{levels} levels");
        let fired = advance_values(&mut wheel, u64::MAX);
        assert_eq!(fired, expected[due..], "{levels} levels");
    }
}

#[test]
fn small_wheels_follow_next_expiration_through_overflow() {
    for levels in [1, 2, 3] {
        let mut rng = Rng(levels as u64);
        let mut wheel = wheel_at(Some(levels), 77);
        let mut expected = Vec::new();
        for _ in 0..300 {
            let deadline = 78 + rng.below(1 << (8 + 2 * levels));
            wheel.insert(deadline, deadline).unwrap();
            expected.push(deadline);
        }
        for deadline in [1 << 40, u64::MAX] {
            wheel.insert(deadline, deadline).unwrap();
            expected.push(deadline);
        }
        expected.sort_unstable();
        assert_eq!(
            follow_next_expiration(&mut wheel),
            expected,
            "{levels} levels"
        );
    }
}

// ----------------------------------------------------------------------------------------
// next_expiration
// ----------------------------------------------------------------------------------------

#[test]
fn next_expiration_values() {
    let mut wheel = Wheel::new();
    assert_eq!(wheel.next_expiration(), None);
    let k70 = wheel.insert(70, 70).unwrap();
    // Level 1, slot 1: the wheel has work (moving the entry down) at tick 64.
    assert_eq!(wheel.next_expiration(), Some(64));
    let k5 = wheel.insert(5, 5).unwrap();
    assert_eq!(wheel.next_expiration(), Some(5));
    assert_eq!(advance_values(&mut wheel, 5), [5]);
    // The advance moved the next window's entries down ahead of time: 70 is in the near ring.
    assert_eq!(wheel.next_expiration(), Some(70));
    advance_quiet(&mut wheel, 64);
    assert_eq!(wheel.next_expiration(), Some(70));
    assert_eq!(wheel.remove(k70), Some(70));
    assert_eq!(wheel.next_expiration(), None);
    assert_eq!(wheel.remove(k5), None);

    // From tick 0, 64^k + 1 (k < 6) waits in level k and comes due at 64^k.
    for k in 1..=5 {
        let mut wheel = Wheel::new();
        wheel.insert(pow64(k) + 1, 0).unwrap();
        assert_eq!(wheel.next_expiration(), Some(pow64(k)), "k = {k}");
        wheel.insert(pow64(k) - 1, 0).unwrap();
        assert_eq!(
            wheel.next_expiration(),
            Some(pow64(k) - pow64(k - 1)),
            "k = {k}"
        );
    }

    // Beyond the default wheel's levels: the overflow list comes due at the start of the
    // top-level block of its earliest deadline.
    let mut wheel = Wheel::new();
    wheel.insert(pow64(6) + 5, 0).unwrap();
    assert_eq!(wheel.next_expiration(), Some(pow64(6)));
    wheel.insert(5 * pow64(6) + 5, 0).unwrap();
    assert_eq!(wheel.next_expiration(), Some(pow64(6)));
    assert_eq!(wheel.advance_to(pow64(6), |_, _| {}), 0);
    assert_eq!(wheel.next_expiration(), Some(pow64(6) + 5));

    // Eleven levels: u64::MAX sits in level 10, slot 15.
    let mut wheel = Wheel::with_levels(MAX_LEVELS).unwrap();
    wheel.insert(u64::MAX, 0).unwrap();
    assert_eq!(wheel.next_expiration(), Some(15 << 60));

    // A past deadline is due at the current tick.
    let mut wheel = wheel_at(None, 9_999);
    wheel.insert(1, 1).unwrap();
    assert_eq!(wheel.next_expiration(), Some(9_999));

    // After removing the overflow list's earliest entry its lower bound may be stale, but it
    // never lies after the real earliest deadline, and following it still fires on time.
    let mut wheel = wheel_at(Some(1), 0);
    let early = wheel.insert(1000, 1000).unwrap();
    wheel.insert(5000, 5000).unwrap();
    assert_eq!(wheel.next_expiration(), Some(960));
    assert_eq!(wheel.remove(early), Some(1000));
    let next = wheel.next_expiration().unwrap();
    assert!(next <= 4992, "{next}");
    assert_eq!(follow_next_expiration(&mut wheel), [5000]);
}

#[test]
fn next_expiration_never_after_the_earliest_deadline() {
    for levels in level_choices() {
        let mut rng = Rng(3);
        let mut wheel = wheel_at(levels, 0);
        let mut pending: BTreeMap<u64, usize> = BTreeMap::new();
        for step in 0..3_000u64 {
            let bits = rng.below(40);
            let deadline = wheel.elapsed() + 1 + rng.below(1 << bits);
            wheel.insert(deadline, deadline).unwrap();
            *pending.entry(deadline).or_default() += 1;
            let next = wheel.next_expiration().unwrap();
            let earliest = *pending.keys().next().unwrap();
            assert!(
                wheel.elapsed() <= next && next <= earliest,
                "{levels:?}: {next} vs {earliest}"
            );
            if step % 3 == 0 {
                // Advance to the next expiration: whatever fires is due exactly then.
                for value in advance_values(&mut wheel, next) {
                    assert_eq!(value, next);
                    let count = pending.get_mut(&value).unwrap();
                    *count -= 1;
                    if *count == 0 {
                        pending.remove(&value);
                    }
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------------------
// The raw wheel over a caller's store
// ----------------------------------------------------------------------------------------

/// Links plus deadlines: deadlines may move later while entries are stored.
struct VecStore(Vec<Links>, Vec<u64>);

impl LinkStore for VecStore {
    fn links(&self, index: u32) -> &Links {
        &self.0[index as usize]
    }
    fn links_mut(&mut self, index: u32) -> &mut Links {
        &mut self.0[index as usize]
    }
    fn deadline(&self, index: u32) -> u64 {
        self.1[index as usize]
    }
}

#[test]
fn raw_wheel_over_a_caller_store() {
    let mut store = VecStore(vec![Links::UNLINKED; 8], vec![0; 8]);
    let mut raw = RawWheel::new(2);
    for (index, deadline) in [(0, 3), (1, 3), (2, 70), (3, 5000), (4, u64::MAX)] {
        store.1[index as usize] = deadline;
        raw.insert(&mut store, index, deadline);
        assert!(store.links(index).is_linked());
    }
    assert_eq!(raw.len(), 5);
    assert!(raw.remove(&mut store, 1));
    assert!(!raw.remove(&mut store, 1), "removed twice");
    assert!(!raw.remove(&mut store, 7), "never inserted");
    assert!(!store.links(1).is_linked());
    let mut fired = Vec::new();
    let count = raw.advance_to(&mut store, 5000, |store, index, due| {
        assert!(
            !store.links(index).is_linked(),
            "entry still linked in its callback"
        );
        assert_eq!(store.deadline(index), due);
        fired.push(index);
        None
    });
    assert_eq!((count, fired), (3, vec![0, 2, 3]));
    assert_eq!(raw.elapsed(), 5000);
    assert_eq!(raw.len(), 1);
    let mut drained = Vec::new();
    raw.drain(&mut store, |_, index| drained.push(index));
    assert_eq!(drained, [4]);
    assert_eq!(raw.len(), 0);
    assert!(!store.links(4).is_linked());
}

// ----------------------------------------------------------------------------------------
// Cascades spread over the window before them
// ----------------------------------------------------------------------------------------

/// A tiny deterministic generator (xorshift), so the crowded tests need no dependency.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn crowded_windows_cascade_in_slices_and_still_fire_exactly() {
    // Far more entries per window than one advance moves ahead of time, so cascades are left
    // half done between advances while entries are removed from and added to every list.
    for levels in level_choices() {
        for start in [0u64, 4096 - 200, pow64(3) - 100] {
            let mut wheel: Wheel<u64> = wheel_at(levels, start);
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ start;
            let mut keys = Vec::new();
            for _ in 0..60_000 {
                let deadline = start + 1 + xorshift(&mut rng) % 400;
                keys.push(wheel.insert(deadline, deadline).unwrap());
            }
            let mut removed = 0;
            let mut expected = 60_000;
            for now in start + 1..=start + 420 {
                let fired = advance_values(&mut wheel, now);
                assert!(
                    fired.iter().all(|&deadline| deadline == now),
                    "{levels:?}: an entry fired at {now} with another deadline"
                );
                expected -= fired.len();
                // Remove a handful of random entries (most still pending, some fired).
                for _ in 0..50 {
                    let key = keys[(xorshift(&mut rng) % keys.len() as u64) as usize];
                    if let Some(deadline) = wheel.remove(key) {
                        assert!(deadline > now, "{levels:?}: pending entry was due");
                        removed += 1;
                        expected -= 1;
                    }
                }
                // Add entries due soon, some in the window being cascaded.
                for _ in 0..20 {
                    let deadline = now + 1 + xorshift(&mut rng) % 130;
                    keys.push(wheel.insert(deadline, deadline).unwrap());
                    expected += 1;
                }
                assert_eq!(wheel.len(), expected, "{levels:?} at {now}");
            }
            assert!(removed > 1000, "the test removed too little: {removed}");
            let rest = advance_values(&mut wheel, start + 1000);
            assert_eq!(rest.len(), expected);
            assert!(rest.windows(2).all(|pair| pair[0] <= pair[1]));
            assert_eq!(wheel.len(), 0);
        }
    }
}

#[test]
fn a_crowded_window_is_moved_down_before_it_is_due() {
    let mut wheel: Wheel<u64> = Wheel::new();
    for index in 0..20_000u64 {
        wheel.insert(128 + index % 64, index).unwrap();
    }
    // The cascade of [128, 192) starts in the window before it and is done by its end.
    advance_quiet(&mut wheel, 64);
    assert_eq!(wheel.next_expiration(), Some(128), "work is due at 128");
    for now in 65..128 {
        advance_quiet(&mut wheel, now);
    }
    let raw = &wheel.raw;
    assert_eq!(raw.next_expiration(), Some(128));
    assert_eq!(
        raw.complete_through(),
        191,
        "the window was not cascaded ahead of time"
    );
    assert_eq!(advance(&mut wheel, 191).len(), 20_000);
}

#[test]
fn deadlines_moved_later_in_place_are_honoured() {
    // The engine's lazy resets: an entry's deadline grows while it stays where it was placed.
    // Wherever it is (far level, cascading, near ring), it must fire at its latest deadline.
    let count = 5_000u32;
    let mut store = VecStore(
        vec![Links::UNLINKED; count as usize],
        vec![0; count as usize],
    );
    let mut raw = RawWheel::new(3);
    let mut rng = 7u64;
    for index in 0..count {
        let deadline = 1 + xorshift(&mut rng) % 300;
        store.1[index as usize] = deadline;
        raw.insert(&mut store, index, deadline);
    }
    let mut fired = vec![None; count as usize];
    let mut retried = vec![false; count as usize];
    for now in 1..3_000u64 {
        raw.advance_to(&mut store, now, |store, index, due| {
            assert!(store.deadline(index) <= due, "entry {index} fired early");
            assert!(fired[index as usize].is_none(), "entry {index} fired twice");
            // Now and then, ask to look again a little later (a reset in progress).
            if (u64::from(index) * 31 + due) % 7 == 0 && !retried[index as usize] {
                retried[index as usize] = true;
                return Some(due + 1);
            }
            fired[index as usize] = Some(due);
            None
        });
        // Push a few pending entries later, in place (for a while: then let all fire).
        for _ in 0..if now < 1_500 { 20 } else { 0 } {
            let index = (xorshift(&mut rng) % u64::from(count)) as usize;
            if fired[index].is_none() {
                store.1[index] = store.1[index].max(now + 1) + xorshift(&mut rng) % 200;
            }
        }
    }
    for (index, fired) in fired.iter().enumerate() {
        let fired = fired.expect("every entry fired");
        let deadline = store.1[index];
        if retried[index] {
            assert!(
                fired >= deadline,
                "entry {index} fired at {fired}, before {deadline}"
            );
        } else {
            assert_eq!(fired, deadline, "entry {index} fired off its deadline");
        }
    }
    assert_eq!(raw.len(), 0);
}
