//! A source whose memory comes from a foreign malloc/free pair: the allocator a
//! `torch.cuda.MemPool(allocator)` was made with (PyTorch's pluggable-allocator functions,
//! `void* malloc(size_t, int device, cudaStream_t)` and `void free(void*, size_t, int,
//! cudaStream_t)`). The pool's segments come from it and go back to it, as natively.
//!
//! Invariants: every block its malloc returned goes back through its free with the size and
//! stream it was allocated with, once; a NULL return is out of memory (as PyTorch reads it) and
//! changes nothing; a block not aligned to 512 bytes is given back at once and refused; the
//! reserved bytes are the blocks out, counted with checked arithmetic.

use super::{Resource, Traits, Usage};
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result, CUDA_ERROR_OUT_OF_MEMORY};
use crate::sync::Mutex;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};

/// `void* malloc(size_t size, int device, cudaStream_t stream)`.
pub type ForeignMalloc = unsafe extern "C" fn(usize, c_int, *mut c_void) -> *mut c_void;
/// `void free(void* ptr, size_t size, int device, cudaStream_t stream)`.
pub type ForeignFree = unsafe extern "C" fn(*mut c_void, usize, c_int, *mut c_void);

/// Where streampool's blocks start (PyTorch's pluggable-allocator contract).
const ALIGNMENT_BYTES: u64 = 512;

pub struct ForeignResource {
    device: usize,
    malloc: ForeignMalloc,
    free: ForeignFree,
    /// Blocks out: address -> (bytes, stream).
    out: Mutex<HashMap<u64, (u64, Stream)>>,
}

impl ForeignResource {
    /// # Safety
    /// `malloc` and `free` must be a matching pair of the signatures above, callable from any
    /// thread for as long as this resource lives, and must not unwind.
    pub unsafe fn new(device: usize, malloc: ForeignMalloc, free: ForeignFree) -> ForeignResource {
        ForeignResource {
            device,
            malloc,
            free,
            out: Mutex::new(HashMap::new()),
        }
    }

    fn call_free(&self, ptr: u64, bytes: u64, stream: Stream) {
        // SAFETY: a block this pair's malloc returned, with its size and stream (see `new`).
        unsafe {
            (self.free)(
                ptr as *mut c_void,
                bytes as usize,
                self.device as c_int,
                stream.0 as *mut c_void,
            )
        }
    }
}

impl Resource for ForeignResource {
    fn allocate(&self, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        let size = usize::try_from(bytes)
            .map_err(|_| Error::InvalidArgument(format!("{bytes} B does not fit a size_t")))?;
        // SAFETY: see `new`; the arguments are of the signature's types.
        let ptr = unsafe { (self.malloc)(size, self.device as c_int, stream.0 as *mut c_void) };
        let ptr = ptr as u64;
        if ptr == 0 {
            return Err(Error::Driver {
                call: "the MemPool allocator's malloc",
                code: CUDA_ERROR_OUT_OF_MEMORY,
                name: format!("it returned NULL for {bytes} B on device {}", self.device),
            });
        }
        if !ptr.is_multiple_of(ALIGNMENT_BYTES) {
            self.call_free(ptr, bytes, stream);
            return Err(Error::InvalidArgument(format!(
                "the MemPool allocator's malloc returned {ptr:#x} for {bytes} B, which is not \
                 {ALIGNMENT_BYTES}-byte aligned (given back through its free)"
            )));
        }
        if self.out.lock().insert(ptr, (bytes, stream)).is_some() {
            return Err(Error::Internal(format!(
                "the MemPool allocator's malloc returned {ptr:#x}, which is still allocated"
            )));
        }
        Ok(DevicePtr(ptr))
    }

    fn deallocate(&self, ptr: DevicePtr, bytes: u64, _stream: Stream) -> Result<()> {
        let mut out = self.out.lock();
        let (out_bytes, stream) = *out.get(&ptr.0).ok_or(Error::UnknownPointer {
            ptr: ptr.0,
            device: self.device,
        })?;
        if out_bytes != bytes {
            return Err(Error::InvalidArgument(format!(
                "{ptr:#x} is a block of {out_bytes} B from the MemPool allocator, not {bytes} B"
            )));
        }
        out.remove(&ptr.0);
        drop(out);
        self.call_free(ptr.0, bytes, stream);
        Ok(())
    }

    fn usage(&self) -> Result<Usage> {
        let out = self.out.lock();
        let bytes = out
            .values()
            .try_fold(0u64, |sum, (b, _)| sum.checked_add(*b))
            .ok_or_else(|| Error::Internal("the MemPool allocator's bytes overflow".into()))?;
        Ok(Usage {
            reserved_bytes: bytes,
            used_bytes: bytes,
        })
    }

    /// Nothing: its blocks are the segments of one memory pool, which gives them back itself.
    fn trim(&self, _keep_bytes: u64) -> Result<()> {
        Ok(())
    }

    fn traits(&self) -> Traits {
        Traits {
            label: "MemPool's own allocator",
            cacheable: false,
            held: true,
            shareable: false,
            returns_before_growth: false,
            fast_path: false,
            // Its free gives a block back at once: what happens next is the allocator's, which
            // PyTorch asks for stream-ordered memory.
            reuses_across_streams: true,
            // It holds nothing beyond its live blocks.
            trims: true,
            checks_free_size: true,
            growth_granule_bytes: 1,
            frees_applied_at_sync: false,
            takes_idle_blocks: false,
            keeps_under_limit: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    static NEXT: AtomicU64 = AtomicU64::new(0x1000_0000);
    static FREED: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

    /// Hands out fresh 512-aligned addresses.
    unsafe extern "C" fn malloc(size: usize, _: c_int, _: *mut c_void) -> *mut c_void {
        NEXT.fetch_add((size as u64).next_multiple_of(512), Ordering::Relaxed) as *mut c_void
    }

    unsafe extern "C" fn free(ptr: *mut c_void, _: usize, _: c_int, _: *mut c_void) {
        FREED.lock().unwrap().push(ptr as u64);
    }

    #[test]
    fn a_free_of_the_wrong_size_or_an_unknown_pointer_is_refused_and_changes_nothing() {
        // SAFETY: a matching pair of the signatures, callable from any thread, never unwinding.
        let r = unsafe { ForeignResource::new(0, malloc, free) };
        let p = r.allocate(4096, Stream(1)).unwrap();
        assert!(r.deallocate(p, 8192, Stream(1)).is_err());
        assert!(r.deallocate(p.offset(512), 512, Stream(1)).is_err());
        assert!(
            !FREED.lock().unwrap().contains(&p.0),
            "nothing went to its free"
        );
        assert_eq!(r.usage().unwrap().used_bytes, 4096);
        r.deallocate(p, 4096, Stream(1)).unwrap();
        assert!(FREED.lock().unwrap().contains(&p.0));
        assert!(r.deallocate(p, 4096, Stream(1)).is_err(), "twice");
        assert_eq!(r.usage().unwrap().used_bytes, 0);
    }
}
