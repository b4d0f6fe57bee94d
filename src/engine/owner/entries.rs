//! The owner's entry table: each timer's wheel links and task, indexed like the slot table.

use crate::task::Task;
use crate::wheel::raw::Links;

/// The owner's records of its timers, indexed like the slot table, in two arrays: each timer's
/// wheel links, and its task. Every wheel operation walks links, its neighbours' too, while
/// only storing, firing and dropping a timer touch its task: kept apart, the links of four
/// times as many timers share the cache.
///
/// The arrays start at slot `base` of the top [`Segment`]: 0, but after a compaction (see
/// `compaction`), which retired the slots below it. While a compaction moves timers, the
/// entries of the retired slots not moved yet stay in a second segment, `below`.
#[derive(Default)]
pub(super) struct Entries {
    top: Segment,
    below: Option<Box<Segment>>,
}

/// Entries for the slots from `base` up.
#[derive(Default)]
pub(super) struct Segment {
    base: u32,
    links: Vec<Links>,
    tasks: Vec<Option<Task>>,
}

impl Segment {
    /// Where slot `index`'s entry is in the arrays, if the segment has one (below `base`, the
    /// subtraction wraps to a position past the end).
    #[inline]
    fn position(&self, index: u32) -> Option<usize> {
        let position = self.at(index);
        (position < self.links.len()).then_some(position)
    }

    /// The position of slot `index`, which the segment must hold.
    #[inline]
    fn at(&self, index: u32) -> usize {
        index.wrapping_sub(self.base) as usize
    }

    /// Grows the segment to hold slot `index`, the new entries vacant.
    fn grow_to_hold(&mut self, index: u32) {
        let len = (index - self.base) as usize + 1;
        if len > self.links.len() {
            self.links.resize(len, Links::UNLINKED);
            self.tasks.resize_with(len, || None);
        }
    }
}

impl Entries {
    /// No entries, for slots from `base` up.
    pub(super) fn from(base: u32) -> Entries {
        Entries {
            top: Segment {
                base,
                ..Segment::default()
            },
            below: None,
        }
    }

    /// The first slot of the top segment (0 unless a compaction retired the slots below).
    #[cfg(test)]
    pub(super) fn base(&self) -> u32 {
        self.top.base
    }

    /// One past the highest slot the table has an entry for (stored or vacant).
    pub(super) fn end(&self) -> u64 {
        self.top.base as u64 + self.top.links.len() as u64
    }

    /// Entries the table has room for.
    pub(super) fn capacity(&self) -> usize {
        self.top.links.capacity()
            + self
                .below
                .as_ref()
                .map_or(0, |below| below.links.capacity())
    }

    /// The segment holding slot `index`'s entry (the top one, unless the slot is below it and
    /// a segment below holds it), and its position there. Most of the table's users reach the
    /// top segment at the cost of its bounds check alone.
    #[inline]
    fn find(&self, index: u32) -> Option<(&Segment, usize)> {
        match self.top.position(index) {
            Some(at) => Some((&self.top, at)),
            None => self.find_below(index),
        }
    }

    /// [`find`](Self::find) in the segment below.
    #[cold]
    fn find_below(&self, index: u32) -> Option<(&Segment, usize)> {
        let below = self.below.as_deref()?;
        Some((below, below.position(index)?))
    }

    /// [`find`](Self::find) in the segment below, for writing.
    #[cold]
    fn find_below_mut(&mut self, index: u32) -> Option<(&mut Segment, usize)> {
        let below = self.below.as_deref_mut()?;
        let at = below.position(index)?;
        Some((below, at))
    }

    /// The segment slot `index` belongs in (to grow).
    fn segment_mut(&mut self, index: u32) -> &mut Segment {
        if index >= self.top.base {
            return &mut self.top;
        }
        match &mut self.below {
            Some(below) => below,
            None => &mut self.top,
        }
    }

    /// Whether the table has an entry (stored or vacant) for slot `index`.
    #[inline]
    pub(super) fn holds(&self, index: u32) -> bool {
        self.find(index).is_some()
    }

    /// Grows the table to hold slot `index`, the new entries vacant.
    pub(super) fn grow_to_hold(&mut self, index: u32) {
        self.segment_mut(index).grow_to_hold(index);
    }

    /// Makes room in the top segment for `additional` more entries, without touching it.
    pub(super) fn reserve(&mut self, additional: usize) {
        self.top.links.reserve_exact(additional);
        self.top.tasks.reserve_exact(additional);
    }

    /// The task place of slot `index`, which the table must hold.
    #[inline]
    pub(super) fn task(&mut self, index: u32) -> &mut Option<Task> {
        let at = self.top.at(index);
        if at < self.top.tasks.len() {
            return &mut self.top.tasks[at];
        }
        let (segment, at) = self
            .find_below_mut(index)
            .expect("an entry the table holds");
        &mut segment.tasks[at]
    }

    /// The links of slot `index`, which the table must hold.
    #[inline]
    pub(super) fn links(&self, index: u32) -> &Links {
        match self.top.links.get(self.top.at(index)) {
            Some(links) => links,
            None => self.links_below(index),
        }
    }

    /// [`links`](Self::links) in the segment below.
    #[cold]
    fn links_below(&self, index: u32) -> &Links {
        let (segment, at) = self.find_below(index).expect("an entry the table holds");
        &segment.links[at]
    }

    /// The links of slot `index`, which the table must hold.
    #[inline]
    pub(super) fn links_mut(&mut self, index: u32) -> &mut Links {
        let at = self.top.at(index);
        if at < self.top.links.len() {
            return &mut self.top.links[at];
        }
        let (segment, at) = self
            .find_below_mut(index)
            .expect("an entry the table holds");
        &mut segment.links[at]
    }

    /// Hints the processor to fetch slot `index`'s entry, if the table holds it.
    #[inline]
    pub(super) fn prefetch(&self, index: u32) {
        if let Some((segment, at)) = self.find(index) {
            crate::prefetch::for_read::<Links>(&segment.links[at]);
            crate::prefetch::for_read::<Option<Task>>(&segment.tasks[at]);
        }
    }

    /// Whether entry `index` holds a task.
    pub(super) fn has_task(&self, index: u32) -> bool {
        match self.top.tasks.get(self.top.at(index)) {
            Some(task) => task.is_some(),
            None => self
                .find_below(index)
                .is_some_and(|(segment, at)| segment.tasks[at].is_some()),
        }
    }

    /// Whether entry `index` is stored in the wheel.
    pub(super) fn is_linked(&self, index: u32) -> bool {
        match self.top.links.get(self.top.at(index)) {
            Some(links) => links.is_linked(),
            None => self
                .find_below(index)
                .is_some_and(|(segment, at)| segment.links[at].is_linked()),
        }
    }

    /// Whether entry `index` holds nothing: no task, no place in the wheel.
    pub(super) fn is_vacant(&self, index: u32) -> bool {
        !self.has_task(index) && !self.is_linked(index)
    }

    /// Every entry's slot, task place and links, both segments.
    pub(super) fn iter_mut(
        &mut self,
    ) -> impl Iterator<Item = (u32, &mut Option<Task>, &mut Links)> {
        self.below
            .as_deref_mut()
            .into_iter()
            .chain(std::iter::once(&mut self.top))
            .flat_map(|segment| {
                let base = segment.base;
                (base..).zip(segment.tasks.iter_mut().zip(segment.links.iter_mut()))
            })
            .map(|(index, (task, links))| (index, task, links))
    }

    /// A compaction retired the slots below `base`: from now on they are in a segment of
    /// their own, below a new top segment from `base` (which takes the entries from `base` up).
    pub(super) fn split_at(&mut self, base: u32) {
        debug_assert!(self.below.is_none(), "the entry table split twice");
        let keep = (base - self.top.base) as usize;
        let mut top = Segment {
            base,
            ..Segment::default()
        };
        if keep < self.top.links.len() {
            top.links = self.top.links.split_off(keep);
            top.tasks = self.top.tasks.split_off(keep);
        }
        self.below = Some(Box::new(std::mem::replace(&mut self.top, top)));
    }

    /// The moves are done: takes the segment below (every entry vacant), to be let go of.
    pub(super) fn take_below(&mut self) -> Option<Box<Segment>> {
        let below = self.below.take();
        debug_assert!(
            below
                .as_ref()
                .is_none_or(|below| below.tasks.iter().all(Option::is_none)),
            "a compaction left a task behind"
        );
        below
    }
}
