//! One allocation request as it passes through the device's stages: what the caller asked for,
//! the block that serves it, and the stream it is ordered on.
//!
//! Invariant: `block_bytes` is `requested_bytes` rounded up to [`BLOCK_ALIGN_BYTES`] (checked: a
//! size whose rounding would wrap is refused), except for a block the cache serves, which is the
//! cached block's size (at most 1/8 larger).

use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::units::round_up;

/// Requests are rounded up to this, as PyTorch's own allocator does.
pub const BLOCK_ALIGN_BYTES: u64 = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub requested_bytes: u64,
    pub block_bytes: u64,
    pub stream: Stream,
}

impl Request {
    /// A request for `requested_bytes` on `stream`.
    #[inline]
    pub fn new(requested_bytes: u64, stream: Stream) -> Result<Request> {
        Request::fitting(requested_bytes, stream).ok_or_else(|| too_large(requested_bytes))
    }

    /// [`Request::new`] as an `Option` (`None`: too large), for the allocation's hot path: no
    /// `Result`, a large value, is built and read back; the caller builds the error
    /// ([`too_large`]).
    #[inline(always)]
    pub fn fitting(requested_bytes: u64, stream: Stream) -> Option<Request> {
        let block_bytes = round_up(requested_bytes, BLOCK_ALIGN_BYTES)?;
        Some(Request {
            requested_bytes,
            block_bytes,
            stream,
        })
    }

    /// The request served by a block of `block_bytes` (a cached block, at most 1/8 larger).
    #[inline]
    pub fn served_by(self, block_bytes: u64) -> Request {
        Request {
            block_bytes,
            ..self
        }
    }
}

/// The error of a request [`Request::fitting`] refuses.
#[cold]
pub fn too_large(requested_bytes: u64) -> Error {
    Error::InvalidArgument(format!("allocation size {requested_bytes} is too large"))
}
