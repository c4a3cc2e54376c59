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
        match round_up(requested_bytes, BLOCK_ALIGN_BYTES) {
            Some(block_bytes) => Ok(Request {
                requested_bytes,
                block_bytes,
                stream,
            }),
            None => Err(too_large(requested_bytes)),
        }
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

#[cold]
fn too_large(requested_bytes: u64) -> Error {
    Error::InvalidArgument(format!("allocation size {requested_bytes} is too large"))
}
