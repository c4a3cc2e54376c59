//! `forward_to_sim!`: the driver traits a test wrapper leaves alone, forwarded to its `sim` field
//! (a `SimDriver`). Included with `#[path]` (and `#[macro_use]`) by the wrappers that need it.
//! `forward_managed_to_sim!(Type)` does the same for `ManagedDriver`.

/// `forward_managed_to_sim!(Type)` implements `ManagedDriver` for `Type` by calling `self.sim`'s
/// methods of the same name.
macro_rules! forward_managed_to_sim {
    ($t:ty) => {
        impl ManagedDriver for $t {
            fn managed_supported(&self, device: usize) -> Result<bool> {
                self.sim.managed_supported(device)
            }
            fn mem_alloc_managed(&self, device: usize, bytes: u64) -> Result<DevicePtr> {
                self.sim.mem_alloc_managed(device, bytes)
            }
            fn mem_free(&self, device: usize, ptr: DevicePtr) -> Result<()> {
                self.sim.mem_free(device, ptr)
            }
        }
    };
}

/// `forward_to_sim!(Type: PeerDriver, IpcDriver, VmmDriver)` implements those traits for `Type` by
/// calling `self.sim`'s methods of the same name.
macro_rules! forward_to_sim {
    ($t:ty: PeerDriver, IpcDriver, VmmDriver) => {
        impl PeerDriver for $t {
            fn can_access_peer(&self, device: usize, peer: usize) -> Result<bool> {
                self.sim.can_access_peer(device, peer)
            }
            fn pool_grant_access(
                &self,
                device: usize,
                pool: PoolHandle,
                peer: usize,
            ) -> Result<()> {
                self.sim.pool_grant_access(device, pool, peer)
            }
        }

        impl IpcDriver for $t {
            fn ipc_supported(&self, device: usize) -> Result<bool> {
                self.sim.ipc_supported(device)
            }
            fn pool_export_fd(&self, device: usize, pool: PoolHandle) -> Result<i32> {
                self.sim.pool_export_fd(device, pool)
            }
            fn pool_import_fd(&self, device: usize, fd: i32) -> Result<PoolHandle> {
                self.sim.pool_import_fd(device, fd)
            }
            fn pointer_export(&self, device: usize, ptr: DevicePtr) -> Result<IpcBytes> {
                self.sim.pointer_export(device, ptr)
            }
            fn pointer_import(
                &self,
                d: usize,
                p: PoolHandle,
                data: &IpcBytes,
            ) -> Result<DevicePtr> {
                self.sim.pointer_import(d, p, data)
            }
            fn ipc_event_record(
                &self,
                device: usize,
                stream: Stream,
            ) -> Result<(EventHandle, IpcBytes)> {
                self.sim.ipc_event_record(device, stream)
            }
            fn ipc_event_wait(
                &self,
                device: usize,
                stream: Stream,
                handle: &IpcBytes,
            ) -> Result<()> {
                self.sim.ipc_event_wait(device, stream, handle)
            }
        }

        impl VmmDriver for $t {
            fn vmm_supported(&self, device: usize) -> Result<bool> {
                self.sim.vmm_supported(device)
            }
            fn vmm_granularity_bytes(&self, device: usize) -> Result<u64> {
                self.sim.vmm_granularity_bytes(device)
            }
            fn address_reserve(&self, device: usize, bytes: u64) -> Result<DevicePtr> {
                self.sim.address_reserve(device, bytes)
            }
            fn address_free(&self, device: usize, base: DevicePtr, bytes: u64) -> Result<()> {
                self.sim.address_free(device, base, bytes)
            }
            fn mem_create(&self, device: usize, bytes: u64) -> Result<MemHandle> {
                self.sim.mem_create(device, bytes)
            }
            fn mem_release(&self, device: usize, handle: MemHandle) -> Result<()> {
                self.sim.mem_release(device, handle)
            }
            fn mem_export_supported(&self, device: usize) -> Result<bool> {
                self.sim.mem_export_supported(device)
            }
            fn mem_create_exportable(&self, device: usize, bytes: u64) -> Result<MemHandle> {
                self.sim.mem_create_exportable(device, bytes)
            }
            fn mem_export_fd(&self, device: usize, handle: MemHandle) -> Result<i32> {
                self.sim.mem_export_fd(device, handle)
            }
            fn mem_import_fd(&self, device: usize, fd: i32) -> Result<MemHandle> {
                self.sim.mem_import_fd(device, fd)
            }
            fn host_alloc(&self, device: usize, bytes: u64) -> Result<HostBuffer> {
                self.sim.host_alloc(device, bytes)
            }
            fn host_free(&self, device: usize, buffer: HostBuffer) {
                self.sim.host_free(device, buffer)
            }
            fn copy_to_host(
                &self,
                d: usize,
                dst: HostBuffer,
                off: u64,
                src: DevicePtr,
                b: u64,
                s: Stream,
            ) -> Result<()> {
                self.sim.copy_to_host(d, dst, off, src, b, s)
            }
            fn copy_to_device(
                &self,
                d: usize,
                dst: DevicePtr,
                src: HostBuffer,
                off: u64,
                b: u64,
                s: Stream,
            ) -> Result<()> {
                self.sim.copy_to_device(d, dst, src, off, b, s)
            }
            fn mem_map(
                &self,
                device: usize,
                at: DevicePtr,
                bytes: u64,
                handle: MemHandle,
            ) -> Result<()> {
                self.sim.mem_map(device, at, bytes, handle)
            }
            fn mem_unmap(&self, device: usize, at: DevicePtr, bytes: u64) -> Result<()> {
                self.sim.mem_unmap(device, at, bytes)
            }
            fn mem_set_access(
                &self,
                d: usize,
                at: DevicePtr,
                b: u64,
                devices: &[usize],
            ) -> Result<()> {
                self.sim.mem_set_access(d, at, b, devices)
            }
        }
    };
}
