//! The sources of one device, in one table: every [`Resource`] its blocks come from — its own
//! resources for large and small blocks (or the virtual-memory resource), graph memory, the
//! shareable pool, and sources added at run time — each under a
//! [`SourceId`]. Every block record of the device (live, cached, waiting, refused on return)
//! carries the id of its source, and a block goes back with `sources[id].deallocate(..)`: nothing
//! recomputes where a block came from.
//!
//! Invariants: an id names one source from the moment it joins the table until it has left it;
//! the table counts, per source, the blocks held from it (from the start of an allocation until
//! the block has gone back); a removed source serves no new allocation and leaves the table only
//! once its count is zero, so an id is never reused while a block of its source is held or being
//! allocated; the device's own sources and graph memory are never removed. The fast own source
//! ([`Sources::fast_own`]) is also read beside the table: standing, it never leaves and its
//! traits are fixed. Its count in the table means nothing (its fast path neither adds nor takes
//! away, its slow path does both), which is harmless only because a standing source's count is
//! never read: nothing may start reading it.
//! The table is plain data under the device lock: it calls no resource.

use super::vmm::VmmResource;
use super::{Resource, Traits};
use crate::error::{Error, Result};
use std::sync::Arc;

/// A source's place in its device's table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId(u32);

#[cfg(test)]
impl SourceId {
    /// An id no table gave (tests of the records that carry one).
    pub(crate) fn for_test(index: u32) -> SourceId {
        SourceId(index)
    }
}

/// A source taken out of the table, for a call made outside the device lock.
#[derive(Clone)]
pub struct Source {
    pub id: SourceId,
    pub resource: Arc<dyn Resource>,
}

impl std::ops::Deref for Source {
    type Target = dyn Resource;

    fn deref(&self) -> &(dyn Resource + 'static) {
        self.resource.as_ref()
    }
}

struct Entry {
    resource: Arc<dyn Resource>,
    traits: Traits,
    /// Blocks held from it, allocations under way included.
    blocks: u64,
    /// It serves no new allocation, and leaves once `blocks` is zero.
    removed: bool,
}

/// The device's own sources, by block size.
#[derive(Debug, Clone, Copy, Default)]
struct Own {
    large: SourceId,
    /// With the largest block it serves.
    small: Option<(SourceId, u64)>,
}

/// The device's own source for every block size where it is the virtual-memory resource, the
/// one with a fast path ([`Traits::fast_path`]): what an allocation's and a free's fast path need
/// of it, read without the table's lookups, and the resource by its own type, called without a
/// dynamic call.
pub struct FastOwn {
    pub id: SourceId,
    pub resource: Arc<VmmResource>,
    /// Its [`Traits::held`].
    pub held: bool,
}

/// The sources of one device (empty until the device's first use).
#[derive(Default)]
pub struct Sources {
    slots: Vec<Option<Entry>>,
    own: Own,
    graph: SourceId,
    shareable: Option<SourceId>,
    fast_own: Option<FastOwn>,
}

impl Sources {
    /// The table of a device whose own resources are `large` and, for blocks up to
    /// `small_max_bytes`, `small`; graph memory joins them.
    pub fn new(
        large: Arc<dyn Resource>,
        small: Option<(Arc<dyn Resource>, u64)>,
        graph: Arc<dyn Resource>,
    ) -> Sources {
        let mut sources = Sources::default();
        sources.own.large = sources.add(large);
        sources.own.small = small.map(|(small, max_bytes)| (sources.add(small), max_bytes));
        sources.graph = sources.add(graph);
        sources
    }

    /// The table of a device whose own resources are `own`, with graph memory; the
    /// virtual-memory resource is also its fast own source ([`Sources::fast_own`]).
    pub fn of(own: super::Own, graph: Arc<dyn Resource>) -> Sources {
        match own {
            super::Own::Split { large, small } => Sources::new(large, small, graph),
            super::Own::Vmm(vmm) => {
                // (Its fast path serves blocks the cache never sees: a test checks its traits.)
                let mut sources = Sources::new(Arc::clone(&vmm) as _, None, graph);
                sources.fast_own = Some(FastOwn {
                    id: sources.own.large,
                    held: vmm.traits().held,
                    resource: vmm,
                });
                sources
            }
        }
    }

    /// The device's own source for every block size where it is the virtual-memory resource;
    /// `None` on the other backends.
    #[inline(always)]
    pub fn fast_own(&self) -> Option<&FastOwn> {
        self.fast_own.as_ref()
    }

    /// Adds `resource`; its id is the lowest free one.
    pub fn add(&mut self, resource: Arc<dyn Resource>) -> SourceId {
        let entry = Entry {
            traits: resource.traits(),
            resource,
            blocks: 0,
            removed: false,
        };
        match self.slots.iter().position(Option::is_none) {
            Some(i) => {
                self.slots[i] = Some(entry);
                SourceId(i as u32)
            }
            None => {
                self.slots.push(Some(entry));
                SourceId((self.slots.len() - 1) as u32)
            }
        }
    }

    /// Removes `id`: it serves no new allocation, and leaves the table once no block of it is
    /// held. The resource, if it left the table now (drop it outside the device lock).
    pub fn remove(&mut self, id: SourceId) -> Result<Option<Arc<dyn Resource>>> {
        if self.is_standing(id) {
            return Err(Error::InvalidArgument(format!(
                "source {id:?} is one of the device's standing sources"
            )));
        }
        let entry = self.entry_mut(id)?;
        entry.removed = true;
        Ok(self.vacate_if_done(id))
    }

    /// The device's own sources, graph memory and the shareable pool.
    fn is_standing(&self, id: SourceId) -> bool {
        id == self.own.large
            || self.own.small.is_some_and(|(small, _)| small == id)
            || id == self.graph
            || self.shareable == Some(id)
    }

    /// The device's own source for a block of `block_bytes`.
    #[inline]
    pub fn for_size(&self, block_bytes: u64) -> SourceId {
        match self.own.small {
            Some((small, max_bytes)) if block_bytes <= max_bytes => small,
            _ => self.own.large,
        }
    }

    /// Graph memory, for allocations on a capturing stream.
    pub fn graph(&self) -> SourceId {
        self.graph
    }

    /// The shareable pool, once there is one.
    pub fn shareable(&self) -> Option<SourceId> {
        self.shareable
    }

    /// Makes `id` the shareable pool.
    pub fn set_shareable(&mut self, id: SourceId) {
        self.shareable = Some(id);
    }

    /// The device's own resources, the large-block one first.
    pub fn own(&self) -> Vec<Arc<dyn Resource>> {
        let small = self.own.small.map(|(small, _)| small);
        std::iter::once(self.own.large)
            .chain(small)
            .filter_map(|id| self.entry(id).ok().map(|e| Arc::clone(&e.resource)))
            .collect()
    }

    /// What `id` is.
    #[cfg(test)]
    pub fn traits(&self, id: SourceId) -> Result<Traits> {
        Ok(self.entry(id)?.traits)
    }

    /// True if `id`'s freed blocks may wait in the device's cache (false for an id not in the
    /// table): its [`Traits::cacheable`], read without building a Result, for every free.
    #[inline(always)]
    pub fn cacheable(&self, id: SourceId) -> bool {
        matches!(self.slots.get(id.0 as usize), Some(Some(entry)) if entry.traits.cacheable)
    }

    /// `id`'s resource, for a call outside the device lock.
    pub fn get(&self, id: SourceId) -> Result<Source> {
        Ok(Source {
            id,
            resource: Arc::clone(&self.entry(id)?.resource),
        })
    }

    /// An allocation from `id` begins: it counts as a block held from it until
    /// [`Sources::allocation_failed`] or [`Sources::returned`]. A removed source refuses.
    pub fn begin_allocation(&mut self, id: SourceId) -> Result<Source> {
        let entry = self.entry_mut(id)?;
        if entry.removed {
            return Err(Error::InvalidArgument(format!(
                "source {id:?} was removed: it serves no new allocation"
            )));
        }
        entry.blocks += 1;
        self.get(id)
    }

    /// An allocation begun from `id` failed.
    pub fn allocation_failed(&mut self, id: SourceId) {
        self.block_left(id);
    }

    /// A block of `id` went back to it.
    #[inline(always)]
    pub fn returned(&mut self, id: SourceId) {
        if let Some(Some(entry)) = self.slots.get_mut(id.0 as usize) {
            entry.blocks = entry.blocks.saturating_sub(1);
            if entry.removed {
                self.block_left_removed(id);
            }
        }
    }

    /// True if `id`'s blocks are streampool's to hold ([`Traits::held`]; true for an id not in
    /// the table, whose blocks are held until they can go back).
    #[inline(always)]
    pub fn held(&self, id: SourceId) -> bool {
        match self.slots.get(id.0 as usize) {
            Some(Some(entry)) => entry.traits.held,
            _ => true,
        }
    }

    /// A removed source's block went back: it leaves the table with its last one.
    #[cold]
    fn block_left_removed(&mut self, id: SourceId) {
        // The caller holds the resource (it just called it): this drop is not the last.
        drop(self.vacate_if_done(id));
    }

    fn block_left(&mut self, id: SourceId) {
        if let Ok(entry) = self.entry_mut(id) {
            entry.blocks = entry.blocks.saturating_sub(1);
            // The caller holds the resource (it just called it): this drop is not the last.
            drop(self.vacate_if_done(id));
        }
    }

    /// Empties `id`'s slot if it was removed and holds no block; its resource if so.
    fn vacate_if_done(&mut self, id: SourceId) -> Option<Arc<dyn Resource>> {
        let slot = self.slots.get_mut(id.0 as usize)?;
        let done = slot.as_ref().is_some_and(|e| e.removed && e.blocks == 0);
        done.then(|| slot.take().map(|e| e.resource)).flatten()
    }

    fn entry(&self, id: SourceId) -> Result<&Entry> {
        match self.slots.get(id.0 as usize) {
            Some(Some(entry)) => Ok(entry),
            _ => Err(unknown(id)),
        }
    }

    fn entry_mut(&mut self, id: SourceId) -> Result<&mut Entry> {
        match self.slots.get_mut(id.0 as usize) {
            Some(Some(entry)) => Ok(entry),
            _ => Err(unknown(id)),
        }
    }
}

#[cold]
fn unknown(id: SourceId) -> Error {
    Error::Internal(format!("no source {id:?} in the device's table"))
}

#[cfg(test)]
mod tests;
