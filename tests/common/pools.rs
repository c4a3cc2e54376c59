//! PyTorch's memory pools as the tests drive them: a pool id, the filters PyTorch's routes use,
//! and an allocation as `my_malloc` makes it (the pool whose route claims the stream serves).

use super::{s, Rig};
use streampool::driver::{DevicePtr, Stream};
use streampool::StreamFilter;

pub const POOL: (u64, u64) = (0, 1);

/// Claims allocations on one stream, as a capture's filter claims its capturing stream.
pub struct OnStream(pub Stream);

/// Claims every allocation (a NULL filter).
pub struct Every;

impl StreamFilter for Every {
    fn claims(&self, _: Stream) -> bool {
        true
    }
}

impl StreamFilter for OnStream {
    fn claims(&self, stream: Stream) -> bool {
        stream == self.0
    }
}

/// What my_malloc does: the pool whose route claims the stream, if any, serves.
pub fn malloc_routed(r: &Rig, bytes: u64, stream: usize) -> DevicePtr {
    let pool = r.device(0).graph_pools().claiming(s(stream));
    r.alloc.malloc_into(bytes, 0, s(stream), pool).unwrap()
}
