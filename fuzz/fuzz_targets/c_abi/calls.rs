//! The C-ABI fuzz target's calls that need no model: export/import round trips and the answers
//! that depend on the device index alone.

use super::*;
use harness::Block;

/// Exports `block`; a shareable one is imported (as another process would), closed, released.
pub fn export_import(block: Block, s: *mut c_void) {
    let ptr = block.ptr as *mut c_void;
    // SAFETY: an all-zero handle is a valid value of this plain struct.
    let mut handle: StreampoolIpcHandle = unsafe { std::mem::zeroed() };
    // SAFETY: a live block; `handle` writable.
    let status = unsafe { streampool_ipc_export(ptr, block.device, s, &mut handle) };
    if !block.shareable {
        expect("streampool_ipc_export", status, INVALID);
        return expect_message("streampool_ipc_export", "not in a shareable pool");
    }
    expect("streampool_ipc_export", status, OK);
    assert_eq!((handle.device, handle.block_bytes % 512), (block.device, 0));
    let mut pool = 0u64;
    // SAFETY: the exporter's own descriptor; `pool` writable.
    let status = unsafe { streampool_ipc_import_pool(block.device, handle.pool_fd, &mut pool) };
    expect("streampool_ipc_import_pool", status, OK);
    let mut imported = std::ptr::null_mut();
    // SAFETY: a handle the library wrote; `imported` writable.
    let status = unsafe { streampool_ipc_import(pool, &handle, s, &mut imported) };
    expect("streampool_ipc_import", status, OK);
    assert_eq!(
        imported, ptr,
        "the simulator maps an import at the exporter's address"
    );
    // SAFETY: an import of this process.
    expect(
        "streampool_ipc_close",
        unsafe { streampool_ipc_close(imported, s) },
        OK,
    );
    // SAFETY: no pointers.
    let status = unsafe { streampool_ipc_release_export(block.device, handle.event) };
    expect("streampool_ipc_release_export", status, OK);
}

/// The answers that depend on the device index alone.
pub fn queries(d: c_int) {
    let flag = if valid(d) { 1 } else { INVALID };
    // SAFETY: no pointers.
    unsafe {
        expect(
            "streampool_pools_supported",
            streampool_pools_supported(d),
            flag,
        );
        expect(
            "streampool_ipc_supported",
            streampool_ipc_supported(d),
            flag,
        );
        expect(
            "streampool_vmm_supported",
            streampool_vmm_supported(d),
            flag,
        );
        expect(
            "streampool_device_count",
            streampool_device_count(),
            DEVICES,
        );
        expect("streampool_check_config", streampool_check_config(), OK);
        assert!(!CStr::from_ptr(streampool_version()).to_bytes().is_empty());
        assert_eq!(CStr::from_ptr(streampool_driver_name()).to_bytes(), b"sim");
    }
}
