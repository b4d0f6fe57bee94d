use super::pages::page_len;
use super::spares::SPARES;
use super::*;

#[test]
fn locate_pages() {
    assert_eq!(locate(0), (0, 0));
    assert_eq!(locate(63), (0, 63));
    assert_eq!(locate(64), (1, 0));
    assert_eq!(locate(191), (1, 127));
    assert_eq!(locate(192), (2, 0));
    let (page, offset) = locate(u32::MAX - 2);
    assert!(page < PAGES && offset < page_len(page));
}

#[test]
fn lifecycle_and_reuse() {
    let table = SlotTable::new();
    let (index, generation) = table.allocate().unwrap();
    table.begin(index, generation, 10, false);
    assert_eq!(table.state(index, generation), TimerState::Pending);
    assert!(table.cancel(index, generation));
    assert!(!table.cancel(index, generation));
    table.let_go(index);
    table.drop_handle(index);
    let (again, next_generation) = table.allocate().unwrap();
    assert_eq!(again, index);
    assert_eq!(next_generation, generation + 1);
    table.begin(again, next_generation, 10, false);
    assert!(
        !table.cancel(index, generation),
        "stale handle must not cancel"
    );
    assert_eq!(table.fire(again, 9, false), FireOutcome::Later(10));
    assert_eq!(
        table.reset_lazy(again, next_generation, 20),
        LazyReset::Done { earlier: false }
    );
    assert_eq!(table.fire(again, 10, false), FireOutcome::Later(20));
    assert_eq!(
        table.reset_lazy(again, next_generation, 15),
        LazyReset::Done { earlier: true }
    );
    assert_eq!(
        table.fire(again, 15, false),
        FireOutcome::Fire { free: false }
    );
    assert_eq!(table.state(again, next_generation), TimerState::Expired);
    assert_eq!(
        table.reset_lazy(again, next_generation, 30),
        LazyReset::NotPending
    );
    assert_eq!(table.allocated(), 1);
}

#[test]
fn repeating_timers_reset_through_the_shard() {
    let table = SlotTable::new();
    let (index, generation) = table.allocate().unwrap();
    table.begin(index, generation, 10, true);
    assert_eq!(
        table.reset_lazy(index, generation, 20),
        LazyReset::Repeating
    );
    assert_eq!(table.reset(index, generation), ResetOutcome::Accepted);
    assert_eq!(table.fire(index, 10, true), FireOutcome::ResetInFlight);
    assert_eq!(table.reset_applied(index, generation), Some(true));
    assert_eq!(table.fire(index, 10, true), FireOutcome::Run);
    assert_eq!(table.allocated(), 1);
}

/// Schedules `count` timers (pending at tick 10); returns their (index, generation).
fn schedule_many(table: &SlotTable, count: usize) -> Vec<(u32, u32)> {
    (0..count)
        .map(|_| {
            let (index, generation) = table.allocate().unwrap();
            table.begin(index, generation, 10, false);
            (index, generation)
        })
        .collect()
}

/// Schedules `count` timers and cancels them the way a handle and the shard do (their
/// handles are left to drop); returns their (index, generation).
fn fill_and_cancel(table: &SlotTable, count: usize) -> Vec<(u32, u32)> {
    let timers = schedule_many(table, count);
    for &(index, generation) in &timers {
        assert!(table.cancel(index, generation));
        table.let_go(index);
    }
    timers
}

#[test]
fn reclaim_then_reuse() {
    let table = SlotTable::new();
    let count = RECLAIM_ABOVE as usize + 1000;
    // A few slots reused many times: their generations run ahead of the others'.
    for _ in 0..5 {
        let (index, generation) = table.allocate().unwrap();
        table.begin(index, generation, 10, false);
        assert!(table.cancel(index, generation));
        table.let_go(index);
        table.drop_handle(index);
    }
    let old = fill_and_cancel(&table, count);
    let newest = old.iter().map(|&(_, generation)| generation).max().unwrap();
    assert_eq!(newest, 5, "slot 0 was reused five times");
    for &(index, _) in &old {
        table.drop_handle(index);
    }
    assert_eq!(table.allocated(), count as u64);
    assert_eq!(table.try_reclaim(), Reclaim::Reclaimed);
    assert_eq!(table.allocated(), 0);
    // The used part of page 6 (slots 4032..) was given back: it reads as zeros.
    #[cfg(target_os = "linux")]
    assert_eq!(table.word(4032 + 512).load(Ordering::Relaxed), 0);
    // Stale operations (a handle's, or a message's) find no timer.
    for &(index, generation) in &old {
        assert!(!table.is_pending(index, generation));
        assert!(
            !table.cancel(index, generation),
            "stale cancel of slot {index}"
        );
        assert_eq!(table.reset_applied(index, generation), None);
    }
    // Allocation starts over, above every old generation, on pages given back.
    let new = fill_and_cancel(&table, count);
    for (position, &(index, generation)) in new.iter().enumerate() {
        assert_eq!(
            index as usize, position,
            "fresh slots are handed out in order"
        );
        assert!(
            generation > newest + 1,
            "generation {generation} not above {newest} + 1"
        );
        assert_eq!(table.state(index, generation), TimerState::Cancelled);
    }
    // The old handles of the same indices still cannot touch the new timers.
    for &(index, generation) in old.iter().take(10) {
        assert!(!table.cancel(index, generation));
    }
    for &(index, _) in &new {
        table.drop_handle(index);
    }
    // Twice in a row works (the generations keep rising).
    assert_eq!(table.try_reclaim(), Reclaim::Reclaimed);
    let (index, generation) = table.allocate().unwrap();
    assert_eq!(index, 0);
    assert!(generation > new[0].1);
}

#[test]
fn reclaim_waits_for_every_handle() {
    let table = SlotTable::new();
    let timers = fill_and_cancel(&table, RECLAIM_ABOVE as usize + 100);
    let (held, held_generation) = timers[1234];
    for &(index, _) in &timers {
        if index != held {
            table.drop_handle(index);
        }
    }
    let Reclaim::Busy { head } = table.try_reclaim() else {
        panic!("reclaimed while a handle was held");
    };
    assert_eq!(head, table.free_head(), "a failed try changes nothing");
    assert_eq!(table.allocated(), timers.len() as u64);
    assert_eq!(table.state(held, held_generation), TimerState::Cancelled);
    table.drop_handle(held);
    assert_ne!(table.free_head(), head, "a free changes the head");
    assert_eq!(table.try_reclaim(), Reclaim::Reclaimed);
}

#[test]
fn reclaim_waits_for_slots_allocated_but_not_begun() {
    let table = SlotTable::new();
    let timers = fill_and_cancel(&table, 100);
    for &(index, _) in &timers {
        table.drop_handle(index);
    }
    assert_eq!(table.try_reclaim(), Reclaim::Nothing, "too small to bother");
    // A fresh slot allocated but not begun yet: its word looks FREE, but it is not on the
    // free list.
    let timers = fill_and_cancel(&table, RECLAIM_ABOVE as usize);
    let (fresh, fresh_generation) = table.allocate().unwrap();
    assert_eq!(table.allocated(), RECLAIM_ABOVE + 1);
    for &(index, _) in &timers {
        table.drop_handle(index);
    }
    assert!(matches!(table.try_reclaim(), Reclaim::Busy { .. }));
    table.begin(fresh, fresh_generation, 10, false);
    assert!(table.cancel(fresh, fresh_generation));
    table.let_go(fresh);
    table.drop_handle(fresh);
    // A popped slot, likewise, through its life.
    let (index, generation) = table.allocate().unwrap();
    assert!(matches!(table.try_reclaim(), Reclaim::Busy { .. }));
    table.begin(index, generation, 10, false);
    assert!(matches!(table.try_reclaim(), Reclaim::Busy { .. }));
    assert!(table.cancel(index, generation));
    table.let_go(index);
    assert!(matches!(table.try_reclaim(), Reclaim::Busy { .. }));
    table.drop_handle(index);
    assert_eq!(table.try_reclaim(), Reclaim::Reclaimed);
}

#[test]
fn exhaustion_neither_undoes_into_ready_nor_creeps() {
    let table = SlotTable::new();
    table
        .fresh
        .next
        .store(ALL_READY | MAX_SLOTS, Ordering::Relaxed);
    for _ in 0..3 {
        assert_eq!(table.allocate(), None);
    }
    assert_eq!(
        table.fresh.next.load(Ordering::Relaxed),
        ALL_READY | MAX_SLOTS,
        "the count stays at the maximum, ready untouched"
    );
}

#[test]
fn cancel_and_release_cancels_and_lets_go_in_one_step() {
    let table = SlotTable::new();
    // Pending: cancelled, the handle gone; the shard's let-go frees the slot.
    let (index, generation) = table.allocate().unwrap();
    table.begin(index, generation, 10, false);
    assert_eq!(table.cancel_and_release(index, generation), Some(false));
    assert_eq!(handles_of(table.word(index).load(Ordering::Relaxed)), 0);
    assert_eq!(table.fire(index, 10, false), FireOutcome::Cancelled);
    table.let_go(index);
    let (again, next_generation) = table.allocate().unwrap();
    assert_eq!((again, next_generation), (index, generation + 1));
    // Fired, the shard gone: not cancelled; the last handle's release frees the slot.
    table.begin(again, next_generation, 10, false);
    assert_eq!(
        table.fire(again, 10, false),
        FireOutcome::Fire { free: false }
    );
    assert_eq!(table.cancel_and_release(again, next_generation), None);
    let (third, third_generation) = table.allocate().unwrap();
    assert_eq!((third, third_generation), (index, generation + 2));
    // Pending with a second handle: cancelled, one handle left.
    table.begin(third, third_generation, 10, false);
    table.clone_handle(third);
    assert_eq!(
        table.cancel_and_release(third, third_generation),
        Some(false)
    );
    assert_eq!(handles_of(table.word(third).load(Ordering::Relaxed)), 1);
    assert_eq!(table.state(third, third_generation), TimerState::Cancelled);
    assert!(!table.cancel(third, third_generation));
    assert_eq!(table.allocated(), 1);
}

#[test]
fn freed_chain_goes_onto_the_list_in_one_push() {
    let table = SlotTable::new();
    let count = RECLAIM_ABOVE as usize + 100;
    let timers = schedule_many(&table, count);
    // Handles gone first, so that the shard's let-go frees: into its chain.
    let mut freed = Freed::default();
    for &(index, generation) in &timers {
        assert!(table.cancel(index, generation));
        table.drop_handle(index);
        table.let_go_into(index, &mut freed, false);
    }
    let head = table.free_head();
    assert_eq!(head as u32, 0, "a chained slot is not on the list yet");
    assert_eq!(
        table.try_reclaim(),
        Reclaim::Busy { head },
        "the reclaim waits for the chain"
    );
    // One more slot on the list before the chain: the chain goes in front of it.
    let (extra, extra_generation) = table.allocate().unwrap();
    assert_eq!(
        extra as usize, count,
        "a fresh slot while the chain is held"
    );
    table.begin(extra, extra_generation, 10, false);
    assert!(table.cancel(extra, extra_generation));
    table.let_go(extra);
    table.drop_handle(extra);
    table.push_freed(&mut freed);
    assert_eq!(table.free_head() >> 34, (head >> 34) + 2, "one push each");
    // Last freed, first handed out, each at the next generation; then the extra slot.
    for &(index, generation) in timers.iter().rev() {
        assert_eq!(table.allocate(), Some((index, generation + 1)));
        table.begin(index, generation + 1, 10, false);
        assert!(!table.cancel(index, generation), "stale cancel of {index}");
    }
    assert_eq!(table.allocate(), Some((extra, extra_generation + 1)));
    // Pushing an empty chain changes nothing.
    let head = table.free_head();
    table.push_freed(&mut freed);
    assert_eq!(table.free_head(), head);
}

/// Stages `count` timers and retracts them all, as their producer: into `spares` while there
/// is room, the rest onto the free list. Returns their (index, generation).
fn stage_and_retract(table: &SlotTable, spares: &Spares, count: usize) -> Vec<(u32, u32)> {
    (0..count)
        .map(|_| {
            let (index, generation) = table.allocate().unwrap();
            table.begin_staged(index, generation, 10);
            assert!(table.retract(index, generation, spares));
            (index, generation)
        })
        .collect()
}

#[test]
fn retracted_slots_come_back_as_spares_at_their_next_generation() {
    let table = SlotTable::new();
    let spares = Spares::default();
    let (index, generation) = stage_and_retract(&table, &spares, 1)[0];
    let head = table.free_head();
    assert_eq!(table.take_spare(&spares), Some((index, generation + 1)));
    assert_eq!(table.free_head(), head, "a spare is on no list");
    assert_eq!(table.take_spare(&spares), None);
    table.begin_staged(index, generation + 1, 10);
    assert!(
        !table.cancel(index, generation),
        "stale handle must not cancel"
    );
    assert!(table.retract(index, generation + 1, &spares));
}

#[test]
fn spares_overflow_onto_the_list_and_are_flushed_before_a_reclaim() {
    let table = SlotTable::new();
    let spares = Spares::default();
    // Held at once, then retracted: the spares fill up, the rest go onto the list.
    let held: Vec<_> = (0..SPARES + 5)
        .map(|_| {
            let (index, generation) = table.allocate().unwrap();
            table.begin_staged(index, generation, 10);
            (index, generation)
        })
        .collect();
    for &(index, generation) in &held {
        assert!(table.retract(index, generation, &spares));
    }
    assert_eq!(spares.len.load(Ordering::Relaxed) as usize, SPARES);
    // Spares block a reclaim until flushed.
    assert!(matches!(table.try_reclaim_above(0), Reclaim::Busy { .. }));
    table.refuse_spares();
    table.flush_spares([&spares]);
    assert_eq!(spares.len.load(Ordering::Relaxed), 0);
    // Refused: a retraction goes onto the list, and no spare is kept.
    stage_and_retract(&table, &spares, 1);
    assert_eq!(spares.len.load(Ordering::Relaxed), 0);
    assert_eq!(table.take_spare(&spares), None);
    assert_eq!(table.try_reclaim_above(0), Reclaim::Reclaimed);
    table.allow_spares();
    for (index, generation) in held {
        assert!(
            !table.cancel(index, generation),
            "stale handle must not cancel"
        );
    }
}

#[test]
fn compaction_moves_a_pending_timer_and_handles_follow() {
    let table = SlotTable::new();
    let (free, free_generation) = table.allocate().unwrap();
    table.begin(free, free_generation, 1, false);
    assert!(table.cancel(free, free_generation));
    table.let_go(free);
    table.drop_handle(free);
    let (live, generation) = table.allocate().unwrap();
    table.begin(live, generation, 1, false);
    let mut survey = table.survey(0).unwrap();
    while !table.walk_survey(&mut survey, u32::MAX) {}
    let mut moved = Vec::new();
    for index in 0..survey.below() {
        if table.classify(&mut survey, index) == SlotClass::Movable {
            moved.push(index);
        }
    }
    let (base, survey) = table.retire(survey, &moved).unwrap();
    assert!(table.move_slot(moved[0], base, survey.is_marked(moved[0])));
    assert_eq!(table.current(live), base);
    assert!(table.is_pending(live, generation));
    assert_eq!(
        table.reset_lazy(live, generation, 5),
        LazyReset::Done { earlier: false }
    );
    assert_eq!(table.fire(base, 4, false), FireOutcome::Later(5));
}
