//! Property test: random sequences of inserts, removals, tick-by-tick steps and jumps, run
//! against `shardwheel::wheel::Wheel` and a simple reference model (a `BTreeMap` of the pending
//! entries with their effective deadlines).
//!
//! The rule the model enforces is exact: an entry whose effective deadline is `d` (its deadline,
//! raised to the wheel's tick when it was inserted in the past) is handed out by the first
//! `advance_to(now)` call after its insertion with `max(now, elapsed()) >= d` (a `now` before the
//! current tick counts as the current tick), and by no other call. So:
//! * tick by tick, every entry fires in the call whose `now` equals its deadline (or, inserted
//!   at or before the current tick, in the very next call);
//! * a jump hands out every entry due in the jumped range, in nondecreasing deadline order;
//! * nothing fires early, late, twice, or not at all; `remove` returns the value iff the entry
//!   is still pending; `len()`, `elapsed()` and `deadline(key)` agree with the model, and
//!   `next_expiration()` lies between the current tick and the earliest pending deadline.

use std::collections::{BTreeMap, HashSet};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::FileFailurePersistence;
use shardwheel::wheel::{EntryKey, Wheel};

/// Cases per property. Four properties run (default, 1-level, 2-level, and 3- or 11-level
/// wheels), each over sequences of up to 200 operations. Measured with
/// `cargo test --test wheel_model` in debug on the 2-core machine: 4 x 768 cases take about
/// 5 s wall (7 s of CPU) on a quiet machine, about 12 s while other builds load it.
const CASES: u32 = 768;

/// 64^k, saturating at u64::MAX (k = 11 and beyond).
fn pow64(k: u32) -> u64 {
    if k >= 11 { u64::MAX } else { 1u64 << (6 * k) }
}

/// A deadline, relative to the wheel's tick when the operation runs.
#[derive(Clone, Debug)]
enum DeadlineSpec {
    /// `elapsed + n` for a small `n` (0 is "now").
    Small(u64),
    /// `elapsed + 64^k + delta`.
    Boundary(u32, i8),
    /// The next multiple of 64^k after `elapsed`, plus `delta`.
    Aligned(u32, i8),
    /// `elapsed + (raw & (2^bits - 1))`: any magnitude.
    Huge(u32, u64),
    /// Any tick at all (often far in the past or future).
    Anywhere(u64),
    /// `u64::MAX` or one before.
    Max(bool),
    /// `elapsed - n`: in the past (clamped to the current tick by the wheel).
    Past(u64),
}

/// Where a jump goes, relative to the wheel's tick when it runs.
#[derive(Clone, Debug)]
enum TargetSpec {
    /// `elapsed + (raw & (2^bits - 1))`.
    Ahead(u32, u64),
    /// `elapsed + 64^k + delta`.
    Boundary(u32, i8),
    /// The next multiple of 64^k after `elapsed`, plus `delta`.
    Aligned(u32, i8),
    /// A pending entry's deadline, plus `delta`.
    ToPending(Index, i8),
    /// `u64::MAX`.
    Max,
    /// `elapsed - n`: counts as `elapsed` (time does not move back; entries inserted at or
    /// before the current tick fire).
    Backwards(u64),
    /// `elapsed` itself: only entries inserted at or before the current tick fire.
    Stay,
}

#[derive(Clone, Debug)]
enum Op {
    Insert(DeadlineSpec),
    /// Removes one of the keys ever handed out (pending, expired or removed).
    Remove(Index),
    /// Advances one tick at a time, this many times.
    Step(u16),
    /// One `advance_to` call.
    Jump(TargetSpec),
}

fn delta() -> impl Strategy<Value = i8> {
    -1i8..=1
}

fn deadline_spec() -> impl Strategy<Value = DeadlineSpec> {
    prop_oneof![
        4 => (0u64..200).prop_map(DeadlineSpec::Small),
        3 => (1u32..=10, delta()).prop_map(|(k, d)| DeadlineSpec::Boundary(k, d)),
        2 => (1u32..=10, delta()).prop_map(|(k, d)| DeadlineSpec::Aligned(k, d)),
        2 => (0u32..=64, any::<u64>()).prop_map(|(b, r)| DeadlineSpec::Huge(b, r)),
        1 => any::<u64>().prop_map(DeadlineSpec::Anywhere),
        1 => any::<bool>().prop_map(DeadlineSpec::Max),
        1 => prop_oneof![0u64..100, any::<u64>()].prop_map(DeadlineSpec::Past),
    ]
}

fn target_spec() -> impl Strategy<Value = TargetSpec> {
    prop_oneof![
        3 => (0u32..=40, any::<u64>()).prop_map(|(b, r)| TargetSpec::Ahead(b, r)),
        2 => (1u32..=10, delta()).prop_map(|(k, d)| TargetSpec::Boundary(k, d)),
        2 => (1u32..=10, delta()).prop_map(|(k, d)| TargetSpec::Aligned(k, d)),
        3 => (any::<Index>(), delta()).prop_map(|(i, d)| TargetSpec::ToPending(i, d)),
        1 => Just(TargetSpec::Max),
        1 => prop_oneof![1u64..100, any::<u64>()].prop_map(TargetSpec::Backwards),
        1 => Just(TargetSpec::Stay),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => deadline_spec().prop_map(Op::Insert),
        3 => any::<Index>().prop_map(Op::Remove),
        3 => (1u16..=300).prop_map(Op::Step),
        2 => target_spec().prop_map(Op::Jump),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..200)
}

fn add(tick: u64, delta: i8) -> u64 {
    tick.saturating_add_signed(i64::from(delta))
}

/// The next multiple of 64^k strictly after `tick` (u64::MAX if none).
fn next_multiple(tick: u64, k: u32) -> u64 {
    let step = pow64(k);
    (tick / step)
        .checked_add(1)
        .and_then(|m| m.checked_mul(step))
        .unwrap_or(u64::MAX)
}

fn low_bits(raw: u64, bits: u32) -> u64 {
    if bits >= 64 {
        raw
    } else {
        raw & ((1u64 << bits) - 1)
    }
}

/// The wheel under test beside its model.
struct Harness {
    wheel: Wheel<u64>,
    /// Pending entries: key -> (effective deadline, value).
    pending: BTreeMap<EntryKey, (u64, u64)>,
    /// Every key ever handed out, in order.
    keys: Vec<EntryKey>,
    issued: HashSet<EntryKey>,
    elapsed: u64,
    next_value: u64,
}

impl Harness {
    fn new(wheel: Wheel<u64>) -> Harness {
        Harness {
            wheel,
            pending: BTreeMap::new(),
            keys: Vec::new(),
            issued: HashSet::new(),
            elapsed: 0,
            next_value: 0,
        }
    }

    fn deadline(&self, spec: &DeadlineSpec) -> u64 {
        let now = self.elapsed;
        match *spec {
            DeadlineSpec::Small(n) => now.saturating_add(n),
            DeadlineSpec::Boundary(k, d) => add(now.saturating_add(pow64(k)), d),
            DeadlineSpec::Aligned(k, d) => add(next_multiple(now, k), d),
            DeadlineSpec::Huge(bits, raw) => now.saturating_add(low_bits(raw, bits)),
            DeadlineSpec::Anywhere(tick) => tick,
            DeadlineSpec::Max(last) => u64::MAX - u64::from(!last),
            DeadlineSpec::Past(n) => now.saturating_sub(n),
        }
    }

    fn target(&self, spec: &TargetSpec) -> u64 {
        let now = self.elapsed;
        match spec {
            TargetSpec::Ahead(bits, raw) => now.saturating_add(low_bits(*raw, *bits)),
            TargetSpec::Boundary(k, d) => add(now.saturating_add(pow64(*k)), *d),
            TargetSpec::Aligned(k, d) => add(next_multiple(now, *k), *d),
            TargetSpec::ToPending(index, d) => {
                let mut deadlines: Vec<u64> = self
                    .pending
                    .values()
                    .map(|&(deadline, _)| deadline)
                    .collect();
                if deadlines.is_empty() {
                    return now;
                }
                deadlines.sort_unstable();
                add(deadlines[index.index(deadlines.len())], *d)
            }
            TargetSpec::Max => u64::MAX,
            TargetSpec::Backwards(n) => now.saturating_sub(*n),
            TargetSpec::Stay => now,
        }
    }

    fn insert(&mut self, deadline: u64) -> Result<(), TestCaseError> {
        let value = self.next_value;
        self.next_value += 1;
        let key = self.wheel.insert(deadline, value).expect("insert failed");
        prop_assert!(self.issued.insert(key), "key {:?} handed out twice", key);
        let effective = deadline.max(self.elapsed);
        prop_assert_eq!(self.wheel.deadline(key), Some(effective));
        self.pending.insert(key, (effective, value));
        self.keys.push(key);
        Ok(())
    }

    fn remove(&mut self, index: &Index) -> Result<(), TestCaseError> {
        if self.keys.is_empty() {
            return Ok(());
        }
        let key = self.keys[index.index(self.keys.len())];
        let expected = self.pending.remove(&key).map(|(_, value)| value);
        prop_assert_eq!(self.wheel.remove(key), expected, "remove({:?})", key);
        prop_assert_eq!(self.wheel.deadline(key), None);
        Ok(())
    }

    /// One `advance_to(now)`: exactly the pending entries due at or before `max(now, elapsed)`
    /// fire, in nondecreasing deadline order.
    fn advance(&mut self, now: u64) -> Result<(), TestCaseError> {
        let mut fired = Vec::new();
        let count = self
            .wheel
            .advance_to(now, |key, value| fired.push((key, value)));
        prop_assert_eq!(count, fired.len());
        // A `now` before the current tick counts as the current tick.
        let now = now.max(self.elapsed);
        let mut last = 0;
        for &(key, value) in &fired {
            let Some((deadline, expected)) = self.pending.remove(&key) else {
                return Err(TestCaseError::fail(format!(
                    "advance_to({now}) from {} handed out {key:?} (value {value}), which is not pending",
                    self.elapsed
                )));
            };
            prop_assert_eq!(value, expected, "wrong value for {:?}", key);
            prop_assert!(
                deadline <= now,
                "entry due at {} fired early, at advance_to({})",
                deadline,
                now
            );
            prop_assert!(
                deadline >= last,
                "out of order: {} after {}",
                deadline,
                last
            );
            last = deadline;
        }
        self.elapsed = self.elapsed.max(now);
        if let Some((key, &(deadline, _))) = self
            .pending
            .iter()
            .find(|&(_, &(deadline, _))| deadline <= now)
        {
            return Err(TestCaseError::fail(format!(
                "advance_to({now}) did not hand out {key:?} due at {deadline} (fired {fired:?})"
            )));
        }
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(self.wheel.len(), self.pending.len());
        prop_assert_eq!(self.wheel.is_empty(), self.pending.is_empty());
        prop_assert_eq!(self.wheel.elapsed(), self.elapsed);
        match self.pending.values().map(|&(deadline, _)| deadline).min() {
            None => prop_assert_eq!(self.wheel.next_expiration(), None),
            Some(earliest) => {
                let next = self.wheel.next_expiration();
                prop_assert!(
                    next.is_some_and(|next| self.elapsed <= next && next <= earliest),
                    "next_expiration {:?} outside [{}, {}]",
                    next,
                    self.elapsed,
                    earliest
                );
            }
        }
        Ok(())
    }

    fn run(&mut self, ops: &[Op]) -> Result<(), TestCaseError> {
        for op in ops {
            match op {
                Op::Insert(spec) => self.insert(self.deadline(spec))?,
                Op::Remove(index) => self.remove(index)?,
                Op::Step(n) => {
                    for _ in 0..*n {
                        if self.elapsed == u64::MAX {
                            break;
                        }
                        self.advance(self.elapsed + 1)?;
                    }
                }
                Op::Jump(spec) => self.advance(self.target(spec))?,
            }
            self.check()?;
        }
        // Whatever is left comes out, in order, in one last jump.
        self.advance(u64::MAX)?;
        self.check()?;
        prop_assert!(self.wheel.is_empty());
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        // Integration tests have no lib.rs beside them: name the regression file directly.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/wheel_model.proptest-regressions"
        ))),
        ..ProptestConfig::with_cases(CASES)
    })]

    #[test]
    fn default_wheel_matches_model(ops in ops()) {
        Harness::new(Wheel::new()).run(&ops)?;
    }

    #[test]
    fn one_level_wheel_matches_model(ops in ops()) {
        Harness::new(Wheel::with_levels(1).unwrap()).run(&ops)?;
    }

    #[test]
    fn two_level_wheel_matches_model(ops in ops()) {
        Harness::new(Wheel::with_levels(2).unwrap()).run(&ops)?;
    }

    #[test]
    fn three_and_eleven_level_wheels_match_model(eleven in any::<bool>(), ops in ops()) {
        let levels = if eleven { 11 } else { 3 };
        Harness::new(Wheel::with_levels(levels).unwrap()).run(&ops)?;
    }
}
