//! The simulator's page-locked host buffers, the copies between them and device memory, and
//! the contents a test wrote into device memory ([`SimDriver::write_memory`]).
//!
//! Invariants: a copy's host range lies in a live buffer and its device range is mapped with
//! access for the copying device, with the device's work done; bytes are carried only where a
//! test wrote them (or they were copied from such memory): other memory reads as zeros.

use super::{Piece, SimVmm};
use crate::driver::sim::{driver_error, SimDriver, SimFault};
use crate::driver::{DevicePtr, HostBuffer, Stream};
use crate::error::Result;

impl SimVmm {
    /// The pieces of `[start, start + bytes)`, which must be mapped without a gap: (created
    /// handle, offset in it, offset from `start`, bytes).
    fn pieces(&self, start: u64, bytes: u64) -> std::result::Result<Vec<Piece>, String> {
        let end = start.checked_add(bytes).ok_or("range overflows")?;
        let mut at = start;
        let mut out = Vec::new();
        while at < end {
            let (base, m) = (self.mappings.range(..=at).next_back())
                .filter(|(&base, m)| at < base + m.bytes)
                .ok_or_else(|| format!("{at:#x} is not mapped"))?;
            let root = self
                .handles
                .get(&m.handle)
                .ok_or("a mapping of no handle")?
                .root;
            let n = (base + m.bytes).min(end) - at;
            out.push((root, at - base, at - start, n));
            at += n;
        }
        Ok(out)
    }

    /// Carries the bytes of `pieces` between device memory and host buffer `host` (of
    /// `host_bytes`) from `offset`: to the host, or from it.
    fn carry(
        &mut self,
        host: usize,
        host_bytes: u64,
        offset: u64,
        pieces: &[Piece],
        to_host: bool,
    ) {
        for &(root, in_handle, from_start, n) in pieces {
            let (h, d, n) = (
                (offset + from_start) as usize,
                in_handle as usize,
                n as usize,
            );
            let handle_bytes = self.handles.get(&root).map_or(0, |r| r.bytes) as usize;
            let (src, dst, src_at, dst_at, dst_bytes) = match to_host {
                true => (
                    &self.contents,
                    &mut self.host_contents,
                    (root, d),
                    (host, h),
                    host_bytes as usize,
                ),
                false => (
                    &self.host_contents,
                    &mut self.contents,
                    (host, h),
                    (root, d),
                    handle_bytes,
                ),
            };
            match src.get(&src_at.0) {
                Some(bytes) => {
                    let to = dst.entry(dst_at.0).or_insert_with(|| vec![0; dst_bytes]);
                    to[dst_at.1..dst_at.1 + n].copy_from_slice(&bytes[src_at.1..src_at.1 + n]);
                }
                None => {
                    if let Some(to) = dst.get_mut(&dst_at.0) {
                        to[dst_at.1..dst_at.1 + n].fill(0);
                    }
                }
            }
        }
    }
}

impl SimDriver {
    /// Writes `data` to `device`'s mapped memory at `ptr`, as a kernel would, for tests that
    /// check contents ([`SimDriver::read_memory`]). An error if it is not all mapped.
    pub fn write_memory(&self, device: usize, ptr: DevicePtr, data: &[u8]) -> Result<()> {
        let mut d = self.devices[device].lock();
        let pieces = d.vmm.pieces(ptr.0, data.len() as u64);
        let pieces = pieces.map_err(|why| driver_error("write_memory", 1, &why))?;
        for (root, in_handle, from_start, n) in pieces {
            let bytes = d.vmm.handles.get(&root).map_or(0, |r| r.bytes) as usize;
            let to = d.vmm.contents.entry(root).or_insert_with(|| vec![0; bytes]);
            let (at, from, n) = (in_handle as usize, from_start as usize, n as usize);
            to[at..at + n].copy_from_slice(&data[from..from + n]);
        }
        Ok(())
    }

    /// The `bytes` of `device`'s mapped memory at `ptr` (zeros where nothing was written).
    pub fn read_memory(&self, device: usize, ptr: DevicePtr, bytes: u64) -> Result<Vec<u8>> {
        let d = self.devices[device].lock();
        let pieces = d.vmm.pieces(ptr.0, bytes);
        let pieces = pieces.map_err(|why| driver_error("read_memory", 1, &why))?;
        let mut out = vec![0; bytes as usize];
        for (root, in_handle, from_start, n) in pieces {
            if let Some(held) = d.vmm.contents.get(&root) {
                let (at, to, n) = (in_handle as usize, from_start as usize, n as usize);
                out[to..to + n].copy_from_slice(&held[at..at + n]);
            }
        }
        Ok(out)
    }

    /// `cuMemAllocHost`: a page-locked host buffer of `bytes`.
    pub(super) fn alloc_host(&self, device: usize, bytes: u64) -> Result<HostBuffer> {
        let call = "cuMemAllocHost";
        self.take_fault(SimFault::HostAlloc, call)?;
        let mut d = self.device(device, call)?;
        if bytes == 0 {
            drop(d);
            return Err(self.misuse(call, "0 bytes".into()));
        }
        d.vmm.next_host += 1;
        let id = d.vmm.next_host;
        d.vmm.host.insert(id, bytes);
        Ok(HostBuffer::from_raw(id))
    }

    /// `cuMemFreeHost` of `buffer`.
    /// A buffer that is not live (freed twice, or never allocated) is a misuse.
    pub(super) fn free_host(&self, device: usize, buffer: HostBuffer) {
        if let Ok(mut d) = self.device(device, "cuMemFreeHost") {
            d.vmm.host_contents.remove(&buffer.raw());
            if d.vmm.host.remove(&buffer.raw()).is_none() {
                drop(d);
                let _ = self.misuse("cuMemFreeHost", "not a live host buffer".into());
            }
        }
    }

    /// A copy on `stream` between host buffer `host.0` (from offset `host.1`) and device memory
    /// at `at`: the host range lies in the buffer, the device range is mapped with access for
    /// `device`, and the work that wrote it is done (the caller synchronised before a sleep, and
    /// a wake copies into fresh pages). The bytes move at once; the device range counts as used
    /// by `stream` until its work up to the copy completes, so that unmapping it sooner is
    /// refused as on a GPU.
    pub(super) fn copy(
        &self,
        call: &'static str,
        device: usize,
        host: (HostBuffer, u64),
        at: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> Result<()> {
        self.take_fault(SimFault::Copy, call)?;
        let (host, offset) = host;
        self.vmm_call(device, None, call, |d| {
            let size = *d
                .vmm
                .host
                .get(&host.raw())
                .ok_or("not a live host buffer")?;
            if offset.checked_add(bytes).is_none_or(|end| end > size) {
                return Err(format!(
                    "{bytes} bytes at {offset} of a host buffer of {size}"
                ));
            }
            let end = at.0.checked_add(bytes).ok_or("range overflows")?;
            for m in d.vmm.covering(at.0, end)? {
                if !m.access.contains(&device) {
                    return Err(format!("{at:#x} has no access for device {device}"));
                }
            }
            let pieces = d.vmm.pieces(at.0, bytes)?;
            let to_host = call == "cuMemcpyDtoHAsync";
            d.vmm.carry(host.raw(), size, offset, &pieces, to_host);
            let seq = d.tick(stream);
            let streams = &d.streams;
            let completed =
                |u: (Stream, u64)| streams.get(&u.0).is_some_and(|c| c.completed >= u.1);
            d.vmm
                .touch(at, bytes, device, device, (stream, seq), completed)
        })
    }
}
