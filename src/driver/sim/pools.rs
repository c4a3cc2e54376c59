//! The simulator's stream-ordered pools: reserved memory grows in 2 MiB granules, a free is
//! pending until its stream completes, and the release threshold applies at synchronisation.
//!
//! Invariant: as CUDA: `used_bytes` counts live and pending blocks, `reserved_bytes` never drops
//! below the used bytes rounded to the granule, a destroyed pool serves nothing, and sizes are
//! checked arithmetic (a size the device cannot hold is out of memory, never a wrap).

use super::{driver_error, SimDevice, SimDriver, SimFault, ALIGN_BYTES, CUDA_ERROR_INVALID_VALUE};
use crate::driver::{DevicePtr, PoolAttr, PoolDriver, PoolHandle, PoolUsage, Stream};
use crate::error::Result;
use crate::units::round_up;
use std::collections::HashMap;

/// The pool's physical granule, as on real GPUs.
const GRANULE_BYTES: u64 = 2 << 20;

pub(super) struct PendingFree {
    ptr: DevicePtr,
    pub(super) bytes: u64,
    stream: Stream,
    seq: u64,
}

pub(super) struct SimPool {
    max_size_bytes: u64,
    release_threshold_bytes: u64,
    pub(super) reserved_bytes: u64,
    reserved_high: u64,
    pub(super) used_bytes: u64,
    used_high: u64,
    pub(super) live: HashMap<DevicePtr, u64>,
    pending: Vec<PendingFree>,
    /// Other devices granted access (`pool_grant_access`).
    pub(super) peers: Vec<usize>,
    pub(super) shareable: bool,
    pub(super) destroyed: bool,
}

/// What a test may ask about a simulated pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimPoolInfo {
    pub handle: PoolHandle,
    pub shareable: bool,
    pub destroyed: bool,
    pub max_size_bytes: u64,
    pub release_threshold_bytes: u64,
    /// Devices granted access, in the order granted.
    pub peers: Vec<usize>,
}

impl SimPool {
    fn note_usage(&mut self) {
        self.used_high = self.used_high.max(self.used_bytes);
        self.reserved_high = self.reserved_high.max(self.reserved_bytes);
    }

    /// True if `[ptr, ptr + bytes)` lies inside one live block.
    pub(super) fn holds(&self, ptr: DevicePtr, bytes: u64) -> bool {
        self.live.iter().any(|(&start, &len)| {
            start <= ptr
                && ptr
                    .0
                    .checked_add(bytes)
                    .is_some_and(|end| end <= start.0 + len)
        })
    }
}

/// The live (not destroyed) pool `pool` of a device.
pub(super) fn get_mut<'a>(
    d: &'a mut SimDevice,
    pool: PoolHandle,
    call: &'static str,
) -> Result<&'a mut SimPool> {
    match d.pools.get_mut(pool.raw()) {
        Some(p) if !p.destroyed => Ok(p),
        _ => Err(driver_error(
            call,
            CUDA_ERROR_INVALID_VALUE,
            "CUDA_ERROR_INVALID_VALUE",
        )),
    }
}

impl SimDevice {
    /// Returns completed frees to their pools' free memory.
    pub(super) fn retire_completed(&mut self) {
        let streams = &self.streams;
        let mut released = Vec::new();
        for pool in &mut self.pools {
            pool.pending.retain(|f| {
                let done = streams.get(&f.stream).is_some_and(|c| c.completed >= f.seq);
                if done {
                    pool.used_bytes -= f.bytes;
                    released.push((f.ptr, f.bytes));
                }
                !done
            });
        }
        self.captured_pending.retain(|f| {
            let done = streams.get(&f.stream).is_some_and(|c| c.completed >= f.seq);
            if done {
                released.push((f.ptr, f.bytes));
            }
            !done
        });
        for (ptr, bytes) in released {
            self.release_range(ptr, bytes);
        }
    }

    /// Graph memory freed on `stream` and still pending serves that stream at once (stream
    /// order), as [`SimDevice::reuse_own_stream`] does for pools.
    pub(super) fn reuse_captured(&mut self, stream: Stream, bytes: u64) -> Option<DevicePtr> {
        let wanted = round_up(bytes, ALIGN_BYTES)?;
        let i = (self.captured_pending.iter().enumerate())
            .filter(|(_, f)| f.stream == stream && f.bytes >= wanted)
            .min_by_key(|(_, f)| f.bytes)
            .map(|(i, _)| i)?;
        let f = self.captured_pending.swap_remove(i);
        if f.bytes > wanted {
            self.captured_pending.push(PendingFree {
                ptr: f.ptr.offset(wanted),
                bytes: f.bytes - wanted,
                ..f
            });
        }
        Some(f.ptr)
    }

    /// A free pending on `stream` itself is reusable by that stream at once (stream order), but by
    /// no other stream until it completes. Takes the smallest such free that holds `bytes`; what
    /// is left of it stays pending, with the same stream and sequence number.
    fn reuse_own_stream(&mut self, pool: usize, stream: Stream, bytes: u64) -> Option<DevicePtr> {
        let wanted = round_up(bytes, ALIGN_BYTES)?;
        let p = &mut self.pools[pool];
        let i = p
            .pending
            .iter()
            .enumerate()
            .filter(|(_, f)| f.stream == stream && f.bytes >= wanted)
            .min_by_key(|(_, f)| f.bytes)
            .map(|(i, _)| i)?;
        let f = p.pending.swap_remove(i);
        p.used_bytes -= f.bytes;
        let rest = f.bytes - wanted;
        if rest > 0 {
            p.used_bytes += rest;
            p.pending.push(PendingFree {
                ptr: f.ptr.offset(wanted),
                bytes: rest,
                ..f
            });
        }
        Some(f.ptr)
    }

    fn reserved_elsewhere(&self, pool: usize) -> u64 {
        self.memory_in_use_bytes() - self.pools[pool].reserved_bytes
    }

    pub(super) fn apply_release_threshold(&mut self) {
        for p in &mut self.pools {
            if p.reserved_bytes > p.release_threshold_bytes {
                let floor = round_up(p.used_bytes, GRANULE_BYTES).unwrap_or(u64::MAX);
                p.reserved_bytes = p.release_threshold_bytes.max(floor);
            }
        }
    }
}

impl SimDriver {
    /// Every pool `device` created, in creation order.
    pub fn pool_infos(&self, device: usize) -> Vec<SimPoolInfo> {
        let d = self.devices[device].lock();
        d.pools
            .iter()
            .enumerate()
            .map(|(i, p)| SimPoolInfo {
                handle: PoolHandle::from_raw(i),
                shareable: p.shareable,
                destroyed: p.destroyed,
                max_size_bytes: p.max_size_bytes,
                release_threshold_bytes: p.release_threshold_bytes,
                peers: p.peers.clone(),
            })
            .collect()
    }

    /// The devices granted access to `device`'s `pool`, in the order granted.
    pub fn pool_peers(&self, device: usize, pool: PoolHandle) -> Vec<usize> {
        self.devices[device].lock().pools[pool.raw()].peers.clone()
    }
}

impl PoolDriver for SimDriver {
    fn pools_supported(&self, device: usize) -> Result<bool> {
        drop(self.device(device, "cuDeviceGetAttribute")?);
        Ok(true)
    }

    fn pool_create(
        &self,
        device: usize,
        max_size_bytes: u64,
        shareable: bool,
    ) -> Result<PoolHandle> {
        self.take_fault(SimFault::PoolCreate, "cuMemPoolCreate")?;
        let mut d = self.device(device, "cuMemPoolCreate")?;
        d.pools.push(SimPool {
            max_size_bytes,
            release_threshold_bytes: 0,
            reserved_bytes: 0,
            reserved_high: 0,
            used_bytes: 0,
            used_high: 0,
            live: HashMap::new(),
            pending: Vec::new(),
            peers: Vec::new(),
            shareable,
            destroyed: false,
        });
        Ok(PoolHandle::from_raw(d.pools.len() - 1))
    }

    fn pool_destroy(&self, device: usize, pool: PoolHandle) -> Result<()> {
        let mut d = self.device(device, "cuMemPoolDestroy")?;
        get_mut(&mut d, pool, "cuMemPoolDestroy")?.destroyed = true;
        Ok(())
    }

    fn pool_set_attr(&self, device: usize, pool: PoolHandle, attr: PoolAttr) -> Result<()> {
        self.take_fault(SimFault::PoolSetAttr, "cuMemPoolSetAttribute")?;
        let mut d = self.device(device, "cuMemPoolSetAttribute")?;
        let p = get_mut(&mut d, pool, "cuMemPoolSetAttribute")?;
        if let PoolAttr::ReleaseThresholdBytes(b) = attr {
            p.release_threshold_bytes = b;
        }
        Ok(())
    }

    fn pool_usage(&self, device: usize, pool: PoolHandle) -> Result<PoolUsage> {
        let mut d = self.device(device, "cuMemPoolGetAttribute")?;
        let p = get_mut(&mut d, pool, "cuMemPoolGetAttribute")?;
        Ok(PoolUsage {
            reserved_bytes: p.reserved_bytes,
            reserved_bytes_high: p.reserved_high,
            used_bytes: p.used_bytes,
            used_bytes_high: p.used_high,
        })
    }

    fn pool_reserved_used(&self, device: usize, pool: PoolHandle) -> Result<(u64, u64)> {
        let u = self.pool_usage(device, pool)?;
        Ok((u.reserved_bytes, u.used_bytes))
    }

    fn pool_reset_peaks(&self, device: usize, pool: PoolHandle) -> Result<()> {
        let mut d = self.device(device, "cuMemPoolSetAttribute")?;
        let p = get_mut(&mut d, pool, "cuMemPoolSetAttribute")?;
        p.reserved_high = p.reserved_bytes;
        p.used_high = p.used_bytes;
        Ok(())
    }

    fn pool_trim(&self, device: usize, pool: PoolHandle, keep_bytes: u64) -> Result<()> {
        let mut d = self.device(device, "cuMemPoolTrimTo")?;
        if !d.frees_applied_at_sync {
            d.retire_completed();
        }
        let p = get_mut(&mut d, pool, "cuMemPoolTrimTo")?;
        let floor = round_up(p.used_bytes, GRANULE_BYTES).unwrap_or(u64::MAX);
        p.reserved_bytes = p.reserved_bytes.min(keep_bytes.max(floor));
        Ok(())
    }

    fn alloc_async(
        &self,
        device: usize,
        pool: PoolHandle,
        bytes: u64,
        stream: Stream,
    ) -> Result<DevicePtr> {
        let call = "cuMemAllocFromPoolAsync";
        self.take_fault(SimFault::Alloc, call)?;
        let mut d = self.device(device, call)?;
        get_mut(&mut d, pool, call)?;
        let block_bytes = round_up(bytes, ALIGN_BYTES).ok_or_else(|| Self::out_of_memory(call))?;
        let reused = d.reuse_own_stream(pool.raw(), stream, block_bytes);
        let elsewhere = d.reserved_elsewhere(pool.raw());
        let fragmented = d.pools_fragmented;
        let p = &mut d.pools[pool.raw()];
        let available = match fragmented {
            true => 0,
            false => p.reserved_bytes - p.used_bytes.min(p.reserved_bytes),
        };
        let mut reserved_bytes = p.reserved_bytes;
        if reused.is_none() && block_bytes > available {
            let growth = round_up(block_bytes - available, GRANULE_BYTES);
            let grown = growth.and_then(|g| p.reserved_bytes.checked_add(g));
            let fits = grown.filter(|&g| {
                g <= p.max_size_bytes
                    && g.checked_add(elsewhere)
                        .is_some_and(|t| t <= self.memory_bytes)
            });
            reserved_bytes = fits.ok_or_else(|| Self::out_of_memory(call))?;
        }
        // The addresses first: a claim that fails (the device's window is full) books nothing.
        let ptr = match reused {
            Some(ptr) => ptr,
            None => d
                .claim_range(block_bytes)
                .ok_or_else(|| Self::out_of_memory(call))?,
        };
        let p = &mut d.pools[pool.raw()];
        p.reserved_bytes = reserved_bytes;
        p.used_bytes += block_bytes;
        p.note_usage();
        d.note_in_use();
        d.pools[pool.raw()].live.insert(ptr, block_bytes);
        if d.capturing.contains(&stream) {
            d.pool_blocks_of_captures.insert(ptr);
        }
        d.tick(stream);
        Ok(ptr)
    }

    fn free_async(&self, device: usize, ptr: DevicePtr, stream: Stream) -> Result<()> {
        self.take_fault(SimFault::Free, "cuMemFreeAsync")?;
        let mut d = self.device(device, "cuMemFreeAsync")?;
        if let Some(count) = d.imported.get_mut(&ptr) {
            *count -= 1;
            if *count == 0 {
                d.imported.remove(&ptr);
            }
            return Ok(());
        }
        let seq = d.tick(stream);
        if let Some(bytes) = d.captured_live.remove(&ptr) {
            // As the default pool's: pending until the stream's work up to here completes.
            let bytes = round_up(bytes, ALIGN_BYTES).expect("a range that was claimed");
            d.captured_pending.push(PendingFree {
                ptr,
                bytes,
                stream,
                seq,
            });
            return Ok(());
        }
        // On a capturing stream the free would be a node of the graph, which CUDA allows only
        // for memory the graph itself allocated: an error on a GPU (and, were it taken, a free
        // at every replay). Counted as a call a capture forbids.
        // (Looked up only while there are any: the replay gates count the simulator's work too.)
        let of_a_capture =
            !d.pool_blocks_of_captures.is_empty() && d.pool_blocks_of_captures.remove(&ptr);
        if d.capturing.contains(&stream)
            && !of_a_capture
            && d.pools.iter().any(|p| p.live.contains_key(&ptr))
        {
            log::debug!("simulated driver: cuMemFreeAsync of pool memory on a capturing stream");
            self.count("unsafe during capture", 1);
        }
        for p in &mut d.pools {
            if let Some(bytes) = p.live.remove(&ptr) {
                p.pending.push(PendingFree {
                    ptr,
                    bytes,
                    stream,
                    seq,
                });
                return Ok(());
            }
        }
        Err(driver_error(
            "cuMemFreeAsync",
            CUDA_ERROR_INVALID_VALUE,
            "CUDA_ERROR_INVALID_VALUE",
        ))
    }
}
