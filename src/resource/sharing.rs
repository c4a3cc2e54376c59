//! What a resource offers for sharing its memory with other processes: the CUDA pool behind it
//! ([`Export`]), or the physical pages under a live block ([`PageExport`]) with the mark that
//! names the block an export was counted on ([`ExportMark`]).
//!
//! Invariant: an export's count belongs to the block it was made of, never to a later block at
//! the same address (the mark is read with the pages, and checked at the mark and the release).

use crate::driver::{DevicePtr, PoolHandle};
use crate::error::Result;

/// See [`super::Capabilities::export`].
pub trait Export {
    /// The CUDA pool behind it, which other processes import.
    fn pool_handle(&self) -> PoolHandle;
}

/// See [`super::Capabilities::page_export`].
pub trait PageExport {
    /// File descriptors of the physical pages under the live block `[ptr, ptr + bytes)`, one per
    /// page in address order (the caller's to close), with where the block starts in the first.
    /// An error, and no descriptor left open, if the block is not live or a page cannot export.
    fn export_pages(&self, ptr: DevicePtr, bytes: u64) -> Result<ExportedPages>;

    /// The export `pages` of the live block `[ptr, ptr + bytes)` went through: its pages are
    /// another process's too until the export is released (the resource may not sleep until
    /// then). An error, and no mark, if the block `pages` were read from is no longer live (a
    /// later block at its address included) or the resource slept since the pages were read.
    /// The mark names this block to [`PageExport::unmark_exported`].
    fn mark_exported(
        &self,
        ptr: DevicePtr,
        bytes: u64,
        pages: &ExportedPages,
    ) -> Result<ExportMark>;
    /// An export `mark`ed on the block at `ptr` was released: every importer closed it. Nothing
    /// if that block was freed (a later block at `ptr` keeps its own count).
    fn unmark_exported(&self, ptr: DevicePtr, mark: ExportMark);
}

/// What [`PageExport::export_pages`] gives.
#[derive(Debug)]
pub struct ExportedPages {
    /// One per page, in address order, the caller's to close; -1 for a page backed by the
    /// handle of the page before it (a span's pages after its first: map them as one).
    pub fds: Vec<i32>,
    pub page_bytes: u64,
    /// Where the block starts from its first page (beyond it when a span begins before the
    /// block).
    pub offset_bytes: u64,
    /// The resource's count of sleeps when the pages were read (a sleep since: other pages).
    pub sleeps_at: u64,
    /// Names the block whose pages these are (freed since: another block may lie there).
    pub mark: ExportMark,
}

/// What [`PageExport::mark_exported`] gives: names the block an export was counted on, so that
/// its release lowers that block's count alone, never a later block's at the same address (a
/// release after the block was freed, against the protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportMark(pub u64);
