//! The records of a freed block on its way back to its source: freed, waiting for the other
//! streams that used it, kept in the cache or not, leaving the ledger with its source's resource.
//!
//! Invariant: a record names the block's source by id and its allocation stream, the one it goes
//! back on; the records are plain values, moved between the ledger and the waits under the
//! device lock.

use crate::cache::CachedBlock;
use crate::driver::{DevicePtr, Stream};
use crate::resource::{Resource, SourceId};
use std::sync::Arc;

/// A block its caller freed that has not gone back to its source yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FreedBlock {
    pub ptr: DevicePtr,
    pub block_bytes: u64,
    /// Its allocation stream: the one it is returned on.
    pub stream: Stream,
    pub source: SourceId,
}

impl FreedBlock {
    pub(super) fn from_cached(b: CachedBlock) -> FreedBlock {
        FreedBlock {
            ptr: b.ptr,
            block_bytes: b.block_bytes,
            stream: b.stream,
            source: b.source,
        }
    }
}

/// A freed block on its way back after the streams that used it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaitingBlock {
    pub block: FreedBlock,
    /// Counted as active until it is handed back.
    pub requested_bytes: u64,
}

/// What [`super::ledger::Ledger::try_keep`] did with a freed block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kept {
    /// It is in the cache.
    Cached,
    /// It goes straight back: its source's blocks are not cached, or the cache takes no block of
    /// its size.
    NotCacheable,
    /// The cache would have to evict blocks to make room ([`super::ledger::Ledger::put_in_cache`]).
    OverBudget,
}

/// A block that left the ledger to go back to its source, with the source's resource (`None`
/// only if the table has no such source, which the return then reports).
pub(crate) struct Returning {
    pub block: FreedBlock,
    pub resource: Option<Arc<dyn Resource>>,
}
