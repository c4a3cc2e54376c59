//! The simulator's twin of CUDA's virtual memory management: address reservations, physical
//! handles, mappings and access, with the checks a real GPU makes or should make.
//!
//! Invariants (each a misuse — an error, a panic when strict — if broken by a caller):
//! reservations and handles are multiples of the granule; a handle is mapped whole, inside one
//! reservation, where nothing is mapped — at one place or several (as CUDA allows), but work of one
//! stream never touches it while another stream's unfinished work uses it at another address; an
//! unmap removes exactly one mapping, and only once all work recorded against it ([`SimDriver::touch`]) has completed; a handle is released
//! only unmapped; memory is touched only where mapped and only by devices given access, the owner
//! included; a reservation is freed only empty. Physical handles count as device memory.
//! Contents are carried only where a test wrote them ([`SimDriver::write_memory`]): such memory
//! keeps its bytes through copies to and from host buffers, other memory reads as zeros.

mod books;
mod controls;
mod host;
mod uses;

use super::{driver_error, SimDevice, SimDriver, SimFault};
use crate::driver::{DevicePtr, HostBuffer, MemHandle, PeerDriver, Stream, VmmDriver};
use crate::error::Result;
use std::collections::{BTreeMap, HashMap};

/// The granule of reservations and handles, as on current GPUs.
pub(super) const GRANULE_BYTES: u64 = 2 << 20;

struct Reservation {
    bytes: u64,
    /// The address range claimed for it (aligned inside).
    claimed_at: DevicePtr,
    claimed_bytes: u64,
}

struct Mapping {
    bytes: u64,
    handle: usize,
    access: Vec<usize>,
    /// The latest (stream, sequence number) of work that used it, per stream.
    uses: Vec<(Stream, u64)>,
}

/// A physical handle: created here, or imported (another reference to a created one's memory).
struct SimHandle {
    bytes: u64,
    /// Where this handle is mapped.
    mapped_at: Vec<u64>,
    exportable: bool,
    /// The created handle whose memory this is (itself, if created here).
    root: usize,
    /// Of a created handle: released by its creator (its memory stays while imports do).
    released: bool,
    /// Of a created handle: imports not yet released.
    imports: u32,
    /// Of a created handle: where it and its imports are mapped.
    group_mapped_at: Vec<u64>,
}

#[derive(Default)]
pub(super) struct SimVmm {
    reservations: BTreeMap<u64, Reservation>,
    /// Physical handles by id.
    handles: HashMap<usize, SimHandle>,
    /// Bytes of the created handles in `handles` (imports are not counted again): kept as they
    /// come and go, read at every call that can grow memory.
    created_bytes: u64,
    next_handle: usize,
    mappings: BTreeMap<u64, Mapping>,
    /// Page-locked host buffers: id -> bytes (copies are checked; bytes are carried only for
    /// memory a test wrote).
    host: HashMap<usize, u64>,
    next_host: usize,
    /// Bytes of created handles a test wrote (or that received such bytes), by handle id; a
    /// handle without an entry holds zeros.
    contents: HashMap<usize, Vec<u8>>,
    /// Bytes of host buffers that received written memory, by buffer id.
    host_contents: HashMap<usize, Vec<u8>>,
}

type Check = std::result::Result<(), String>;

/// A piece of a device range inside one mapping: (created handle, offset in it, offset from the
/// range's start, bytes).
type Piece = (usize, u64, u64, u64);

fn multiple_of_granule(bytes: u64) -> Check {
    match bytes > 0 && bytes.is_multiple_of(GRANULE_BYTES) {
        true => Ok(()),
        false => Err(format!(
            "{bytes} bytes is not a multiple of the {GRANULE_BYTES}-byte granule"
        )),
    }
}

impl SimDriver {
    fn vmm_call<T>(
        &self,
        device: usize,
        fault: Option<SimFault>,
        call: &'static str,
        f: impl FnOnce(&mut SimDevice) -> std::result::Result<T, String>,
    ) -> Result<T> {
        if let Some(fault) = fault {
            self.take_fault(fault, call)?;
        }
        let mut d = self.device(device, call)?;
        self.check_capture_mode(&d, call);
        f(&mut d).map_err(|why| {
            drop(d);
            self.misuse(call, why)
        })
    }
}

impl VmmDriver for SimDriver {
    fn vmm_supported(&self, device: usize) -> Result<bool> {
        drop(self.device(device, "cuDeviceGetAttribute")?);
        Ok(!self.vmm_unsupported.lock().contains(&device))
    }

    fn vmm_granularity_bytes(&self, device: usize) -> Result<u64> {
        drop(self.device(device, "cuMemGetAllocationGranularity")?);
        Ok(GRANULE_BYTES)
    }

    fn address_reserve(&self, device: usize, bytes: u64) -> Result<DevicePtr> {
        let call = "cuMemAddressReserve";
        self.take_fault(SimFault::AddressReserve, call)?;
        let mut d = self.device(device, call)?;
        self.check_capture_mode(&d, call);
        multiple_of_granule(bytes).map_err(|why| self.misuse(call, why))?;
        let claimed_bytes = bytes
            .checked_add(GRANULE_BYTES)
            .ok_or_else(|| Self::out_of_memory(call))?;
        let claimed_at = d
            .claim_range(claimed_bytes)
            .ok_or_else(|| Self::out_of_memory(call))?;
        let base = claimed_at.0.next_multiple_of(GRANULE_BYTES);
        let reservation = Reservation {
            bytes,
            claimed_at,
            claimed_bytes,
        };
        d.vmm.reservations.insert(base, reservation);
        Ok(DevicePtr(base))
    }

    fn address_free(&self, device: usize, base: DevicePtr, bytes: u64) -> Result<()> {
        let call = "cuMemAddressFree";
        let mut d = self.device(device, call)?;
        let check = match d.vmm.reservations.get(&base.0) {
            Some(r) if r.bytes != bytes => {
                Err(format!("{bytes} bytes is not the reservation's size"))
            }
            Some(_)
                if d.vmm
                    .mappings
                    .range(base.0..base.0 + bytes)
                    .next()
                    .is_some() =>
            {
                Err(format!("the reservation at {base:#x} still has mappings"))
            }
            Some(_) => Ok(()),
            None => Err(format!("{base:#x} is not a reservation")),
        };
        if let Err(why) = check {
            drop(d);
            return Err(self.misuse(call, why));
        }
        let r = d.vmm.reservations.remove(&base.0).expect("checked above");
        d.release_range(r.claimed_at, r.claimed_bytes);
        Ok(())
    }

    fn mem_create(&self, device: usize, bytes: u64) -> Result<MemHandle> {
        self.create(device, bytes, false)
    }

    fn mem_export_supported(&self, device: usize) -> Result<bool> {
        drop(self.device(device, "cuDeviceGetAttribute")?);
        Ok(!self.ipc_unsupported.lock().contains(&device))
    }

    fn mem_create_exportable(&self, device: usize, bytes: u64) -> Result<MemHandle> {
        if !self.mem_export_supported(device)? {
            return Err(driver_error("cuMemCreate", 801, "CUDA_ERROR_NOT_SUPPORTED"));
        }
        self.create(device, bytes, true)
    }

    fn mem_export_fd(&self, device: usize, handle: MemHandle) -> Result<i32> {
        let call = "cuMemExportToShareableHandle";
        self.take_fault(SimFault::MemExport, call)?;
        let root = {
            let d = self.device(device, call)?;
            match d.vmm.handles.get(&handle.raw()) {
                Some(h) if h.exportable => h.root,
                _ => return Err(driver_error(call, 1, "CUDA_ERROR_INVALID_VALUE")),
            }
        };
        // SAFETY: creates an anonymous file; its inode names the handle.
        let fd = unsafe { libc::memfd_create(c"streampool-sim-page".as_ptr(), 0) };
        let ino = super::ipc::inode(fd)
            .ok_or_else(|| driver_error(call, 1, "CUDA_ERROR_INVALID_VALUE"))?;
        self.exported_handles.lock().insert(ino, (device, root));
        Ok(fd)
    }

    fn mem_import_fd(&self, device: usize, fd: i32) -> Result<MemHandle> {
        let call = "cuMemImportFromShareableHandle";
        let exported =
            super::ipc::inode(fd).and_then(|ino| self.exported_handles.lock().get(&ino).copied());
        let mut d = self.device(device, call)?;
        let root = match exported {
            Some((dev, root)) if dev == device && d.vmm.handles.contains_key(&root) => root,
            _ => return Err(driver_error(call, 1, "CUDA_ERROR_INVALID_VALUE")),
        };
        let bytes = d.vmm.handles[&root].bytes;
        let id = d.vmm.new_handle(bytes, true, Some(root));
        Ok(MemHandle::from_raw(id))
    }

    fn mem_release(&self, device: usize, handle: MemHandle) -> Result<()> {
        self.vmm_call(device, Some(SimFault::MemRelease), "cuMemRelease", |d| {
            d.vmm.release_handle(handle.raw())
        })
    }

    fn mem_map(&self, device: usize, at: DevicePtr, bytes: u64, handle: MemHandle) -> Result<()> {
        self.vmm_call(device, Some(SimFault::MemMap), "cuMemMap", |d| {
            let vmm = &mut d.vmm;
            let end = at.0.checked_add(bytes).ok_or("range overflows")?;
            match vmm.handles.get(&handle.raw()) {
                None => return Err(format!("{handle:?} is not a live handle")),
                Some(h) if h.root == handle.raw() && h.released => {
                    return Err(format!("{handle:?} was released"))
                }
                Some(h) if h.bytes != bytes => {
                    return Err(format!("{handle:?} is {} bytes, not {bytes}", h.bytes))
                }
                Some(_) => {}
            }
            match vmm.reservation_of(at.0) {
                Some((base, len)) if end <= base + len => {}
                _ => return Err(format!("{at:#x}+{bytes} is not inside one reservation")),
            }
            let before = vmm.mappings.range(..end).next_back();
            if before.is_some_and(|(&start, m)| start + m.bytes > at.0) {
                return Err(format!("{at:#x}+{bytes} overlaps a mapping"));
            }
            let root = vmm.handles[&handle.raw()].root;
            if let Some(h) = vmm.handles.get_mut(&handle.raw()) {
                h.mapped_at.push(at.0);
            }
            if let Some(r) = vmm.handles.get_mut(&root) {
                r.group_mapped_at.push(at.0);
            }
            let mapping = Mapping {
                bytes,
                handle: handle.raw(),
                access: Vec::new(),
                uses: Vec::new(),
            };
            vmm.mappings.insert(at.0, mapping);
            Ok(())
        })
    }

    fn mem_unmap(&self, device: usize, at: DevicePtr, bytes: u64) -> Result<()> {
        self.vmm_call(device, Some(SimFault::MemUnmap), "cuMemUnmap", |d| {
            let m = match d.vmm.mappings.get(&at.0) {
                Some(m) if m.bytes == bytes => m,
                _ => return Err(format!("{at:#x}+{bytes} is not one whole mapping")),
            };
            if let Some(&(stream, _)) = m.uses.iter().find(|u| !d.completed(**u)) {
                return Err(format!(
                    "unmapping {at:#x}+{bytes} while unfinished work on stream {stream:#x} uses it"
                ));
            }
            let m = d.vmm.mappings.remove(&at.0).expect("checked above");
            let root = d.vmm.handles.get(&m.handle).map_or(m.handle, |h| h.root);
            if let Some(h) = d.vmm.handles.get_mut(&m.handle) {
                h.mapped_at.retain(|&a| a != at.0);
            }
            if let Some(r) = d.vmm.handles.get_mut(&root) {
                r.group_mapped_at.retain(|&a| a != at.0);
            }
            Ok(())
        })
    }

    fn mem_set_access(
        &self,
        device: usize,
        at: DevicePtr,
        bytes: u64,
        devices: &[usize],
    ) -> Result<()> {
        let call = "cuMemSetAccess";
        self.take_fault(SimFault::SetAccess, call)?;
        for &peer in devices.iter().filter(|&&p| p != device) {
            if !self.can_access_peer(device, peer)? {
                return Err(driver_error(call, 101, "CUDA_ERROR_INVALID_DEVICE"));
            }
        }
        let covered = self.vmm_call(device, None, call, |d| {
            let end = at.0.checked_add(bytes).ok_or("range overflows")?;
            if !d.vmm.mappings.contains_key(&at.0) {
                return Err(format!("{at:#x} starts no mapping"));
            }
            let mappings = d.vmm.covering(at.0, end)?;
            let covered = mappings.len() as u64;
            for m in mappings {
                for &dev in devices {
                    if !m.access.contains(&dev) {
                        m.access.push(dev);
                    }
                }
            }
            Ok(covered)
        })?;
        // What a call costs grows with the handles it covers (H100: ~21 us each).
        self.count("cuMemSetAccess handles", covered);
        Ok(())
    }
    fn host_alloc(&self, device: usize, bytes: u64) -> Result<HostBuffer> {
        self.alloc_host(device, bytes)
    }

    fn host_free(&self, device: usize, buffer: HostBuffer) {
        self.free_host(device, buffer)
    }

    fn copy_to_host(
        &self,
        device: usize,
        dst: HostBuffer,
        dst_offset: u64,
        src: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> Result<()> {
        let host = (dst, dst_offset);
        self.copy("cuMemcpyDtoHAsync", device, host, src, bytes, stream)
    }

    fn copy_to_device(
        &self,
        device: usize,
        dst: DevicePtr,
        src: HostBuffer,
        src_offset: u64,
        bytes: u64,
        stream: Stream,
    ) -> Result<()> {
        let host = (src, src_offset);
        self.copy("cuMemcpyHtoDAsync", device, host, dst, bytes, stream)
    }
}

impl SimDriver {
    /// `cuMemCreate` of `bytes` on `device`, exportable if asked.
    fn create(&self, device: usize, bytes: u64, exportable: bool) -> Result<MemHandle> {
        let call = "cuMemCreate";
        self.take_fault(SimFault::MemCreate, call)?;
        let mut d = self.device(device, call)?;
        self.check_capture_mode(&d, call);
        multiple_of_granule(bytes).map_err(|why| self.misuse(call, why))?;
        let fits = d
            .memory_in_use_bytes()
            .checked_add(bytes)
            .is_some_and(|total| total <= self.memory_bytes);
        if !fits {
            return Err(Self::out_of_memory(call));
        }
        let id = d.vmm.new_handle(bytes, exportable, None);
        d.note_in_use();
        Ok(MemHandle::from_raw(id))
    }
}
