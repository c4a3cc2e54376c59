//! Large blocks of the virtual-memory resource (above `small_max_bytes`): placed by best fit in
//! the free ranges of the large blocks' part of the address space, or in a window of free
//! addresses whose unmapped pages are backed now ([`super::mapping`], [`super::backing`]).
//!
//! Invariants: a block goes to memory its stream may use at once, or to memory other streams
//! freed only once its stream has waited on the GPU for their fences (never during a capture);
//! a block larger than the device, its memory limit or the pool cap is refused before anything
//! is mapped; a window lies in one reservation (a new one is made when none holds it).

use super::ranges::Window;
use super::{Region, VmmResource, VmmState};
use crate::driver::Stream;
use crate::error::{Error, Result, CUDA_ERROR_OUT_OF_MEMORY};

impl VmmResource {
    /// A large block for `stream`: a mapped range it may use at once, one freed on another
    /// stream after a GPU-side wait for its fence, or a window whose pages are mapped now.
    pub(super) fn place_large(&self, st: &mut VmmState, bytes: u64, stream: Stream) -> Result<u64> {
        if let Some(start) = self.take_free(st, false, bytes, stream) {
            return Ok(start);
        }
        if bytes > self.physical_cap_bytes().min(self.device_total_bytes) {
            return Err(Error::Driver {
                call: "cuMemCreate",
                code: CUDA_ERROR_OUT_OF_MEMORY,
                name: "CUDA_ERROR_OUT_OF_MEMORY (more than the device, its memory limit or \
                       STREAMPOOL_MAX_POOL_SIZE allows)"
                    .into(),
            });
        }
        // Before memory is mapped: empty slabs give their carriers back, whose idle pages may
        // back the window ([`backing`]).
        let _ = self.return_empty_slabs(st);
        if let Some(start) = self.place_ahead(st, bytes, stream) {
            return Ok(start);
        }
        let window = self.large_window(st, bytes, stream)?;
        self.map_window(st, Region::Large, &window, bytes, stream, None)?;
        st.large.take(window.start, bytes);
        Ok(window.start)
    }

    /// A window for `bytes` on `stream` among the large blocks' ranges (in another reservation
    /// if none fits), which may cover memory other streams freed once `stream` has waited for
    /// their fences on the GPU; if a wait cannot be made, a window of memory `stream` may use.
    fn large_window(&self, st: &mut VmmState, bytes: u64, stream: Stream) -> Result<Window> {
        // During a capture no fence is recorded for a wait: only memory `stream` may use.
        let with_others: &[bool] = match self.capturing(st) {
            true => &[false],
            false => &[true, false],
        };
        for &others in with_others {
            let window = match st.large.window(bytes, stream, others) {
                Some(window) => window,
                None => {
                    self.reserve(st, Region::Large, bytes.max(self.extent_bytes))?;
                    st.large.window(bytes, stream, others).ok_or_else(|| {
                        Error::Internal(format!("no window for {bytes} B in a new reservation"))
                    })?
                }
            };
            let waited = (window.waits.iter())
                .all(|&(other, seq)| self.wait_for_fence(st, stream, other, seq));
            if waited {
                return Ok(window);
            }
        }
        Err(Error::Internal(format!("no window for {bytes} B")))
    }
}
