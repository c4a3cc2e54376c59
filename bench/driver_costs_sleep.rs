//! Sleep and wake's driver work on the real driver, for the choices their speed depends on
//! (`COST sleep ...` lines of `scripts/gpu-diag costs`): how the page calls scale with the page
//! size, whether an asynchronous copy runs while the CPU unmaps or maps other pages, and what
//! page-locking host memory costs by `cuMemAllocHost` and by registering 2 MiB-aligned memory
//! that asked the kernel for huge pages.
//!
//! Invariant: a call the driver refuses is printed and ends the probe, leaving what it holds to
//! the process's end (nothing is timed from a half-done step); otherwise every mapping and
//! buffer made here is released before it returns.

use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;
use streampool::driver::{cuda::CudaDriver, DevicePtr, MemHandle, VmmDriver};

const MIB: u64 = 1 << 20;
const RUN_BYTES: u64 = 1024 * MIB;

fn report(what: &str, value: f64, unit: &str) {
    println!("COST sleep {what:<64} {value:10.1} {unit}");
}

fn ok(what: &str, result: sys::CUresult) -> bool {
    if result != sys::CUresult::CUDA_SUCCESS {
        println!("COST sleep {what} refused: {result:?}");
    }
    result == sys::CUresult::CUDA_SUCCESS
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// A run of `RUN_BYTES` mapped in `page_bytes` pages with access, in a reservation of its own.
struct Run {
    base: DevicePtr,
    page_bytes: u64,
    handles: Vec<MemHandle>,
}

impl Run {
    fn reserve(driver: &CudaDriver, page_bytes: u64) -> Run {
        let base = driver.address_reserve(0, RUN_BYTES).unwrap();
        Run {
            base,
            page_bytes,
            handles: Vec::new(),
        }
    }

    fn pages(&self) -> u64 {
        RUN_BYTES / self.page_bytes
    }

    fn map(&mut self, driver: &CudaDriver) {
        for i in 0..self.pages() {
            let handle = driver.mem_create(0, self.page_bytes).unwrap();
            let at = DevicePtr(self.base.0 + i * self.page_bytes);
            driver.mem_map(0, at, self.page_bytes, handle).unwrap();
            self.handles.push(handle);
        }
        driver
            .mem_set_access(0, self.base, RUN_BYTES, &[0])
            .unwrap();
    }

    fn unmap(&mut self, driver: &CudaDriver) {
        for (i, handle) in self.handles.drain(..).enumerate() {
            let at = DevicePtr(self.base.0 + i as u64 * self.page_bytes);
            driver.mem_unmap(0, at, self.page_bytes).unwrap();
            driver.mem_release(0, handle).unwrap();
        }
    }

    fn free(mut self, driver: &CudaDriver) {
        self.unmap(driver);
        driver.address_free(0, self.base, RUN_BYTES).unwrap();
    }
}

/// What sleep and wake's choices depend on; see the module's comment.
pub fn sleep_costs(driver: &Arc<CudaDriver>) {
    // The raw copies below need the device's primary context current on this thread.
    let (mut device, mut context) = (0, std::ptr::null_mut());
    // SAFETY: out-parameters of the driver API, valid for the calls.
    let current = unsafe {
        ok("cuDeviceGet", sys::cuDeviceGet(&mut device, 0))
            && ok(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut context, device),
            )
            && ok("cuCtxSetCurrent", sys::cuCtxSetCurrent(context))
    };
    if !current {
        return;
    }
    for page_bytes in [2 * MIB, 32 * MIB] {
        let mut run = Run::reserve(driver, page_bytes);
        let t = Instant::now();
        run.map(driver);
        let map_ms = ms(t);
        let t = Instant::now();
        run.unmap(driver);
        let unmap_ms = ms(t);
        let label = format!("{} MiB pages", page_bytes / MIB);
        report(
            &format!("create + map + access, 1 GiB in {label}"),
            map_ms,
            "ms",
        );
        report(
            &format!("unmap + release, 1 GiB in {label}"),
            unmap_ms,
            "ms",
        );
        run.free(driver);
    }
    overlap(driver);
    pinning(driver);
    // SAFETY: retained above.
    unsafe { sys::cuDevicePrimaryCtxRelease_v2(device) };
}

/// The milliseconds from `copy` to the device's synchronisation, with `work` done on the CPU in
/// between; None (printed) if the driver refused the copy or the synchronisation.
fn copy_beside(copy: impl FnOnce() -> sys::CUresult, work: impl FnOnce()) -> Option<f64> {
    let t = Instant::now();
    if !ok("the copy", copy()) {
        return None;
    }
    work();
    // SAFETY: no arguments.
    ok("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() }).then(|| ms(t))
}

fn how(overlapped: bool) -> &'static str {
    if overlapped {
        "overlapped"
    } else {
        "one after the other"
    }
}

/// A copy of one run on the legacy stream while the CPU unmaps (sleep) or maps (wake) another:
/// the wall time against the same work one after the other.
fn overlap(driver: &CudaDriver) {
    let page = 2 * MIB;
    let host = driver.host_alloc(0, RUN_BYTES).unwrap();
    let (mut data, mut other) = (Run::reserve(driver, page), Run::reserve(driver, page));
    data.map(driver);
    let (host_ptr, bytes, at) = (host.raw() as *mut c_void, RUN_BYTES as usize, data.base.0);
    let null = std::ptr::null_mut();
    // A warm-up copy each way first: the first copy of a buffer is not the one to time.
    // SAFETY: the host buffer and the mapped run are both RUN_BYTES long.
    let warm = unsafe {
        ok(
            "the warm-up copy",
            sys::cuMemcpyDtoH_v2(host_ptr, at, bytes),
        ) && ok(
            "the warm-up copy",
            sys::cuMemcpyHtoD_v2(at, host_ptr, bytes),
        )
    };
    if !warm {
        return;
    }
    for overlapped in [false, true] {
        other.map(driver);
        // SAFETY: the host buffer and the mapped run are both RUN_BYTES long.
        let copy = || unsafe {
            match overlapped {
                true => sys::cuMemcpyDtoHAsync_v2(host_ptr, at, bytes, null),
                false => sys::cuMemcpyDtoH_v2(host_ptr, at, bytes),
            }
        };
        let Some(took_ms) = copy_beside(copy, || other.unmap(driver)) else {
            return;
        };
        let what = format!("sleep: copy 1 GiB out + unmap 1 GiB, {}", how(overlapped));
        report(&what, took_ms, "ms");
    }
    for overlapped in [false, true] {
        // SAFETY: as above.
        let copy = || unsafe {
            match overlapped {
                true => sys::cuMemcpyHtoDAsync_v2(at, host_ptr, bytes, null),
                false => sys::cuMemcpyHtoD_v2(at, host_ptr, bytes),
            }
        };
        let Some(took_ms) = copy_beside(copy, || other.map(driver)) else {
            return;
        };
        let what = format!("wake: copy 1 GiB in + map 1 GiB, {}", how(overlapped));
        report(&what, took_ms, "ms");
        other.unmap(driver);
    }
    data.free(driver);
    other.free(driver);
    driver.host_free(0, host);
}

/// Page-locking 1 GiB of host memory: the driver's `host_alloc` (threads touch huge-page memory,
/// then it is registered), `cuMemAllocHost`, and the same memory touched by one thread, then
/// `cuMemHostRegister`ed.
fn pinning(driver: &CudaDriver) {
    let t = Instant::now();
    let host = driver.host_alloc(0, RUN_BYTES).unwrap();
    report(
        "host_alloc (threads touch huge pages, then register), 1 GiB",
        ms(t),
        "ms",
    );
    driver.host_free(0, host);
    let mut raw: *mut c_void = std::ptr::null_mut();
    let t = Instant::now();
    // SAFETY: valid out-pointer; the primary context is current (sleep_costs).
    if ok("cuMemAllocHost", unsafe {
        sys::cuMemAllocHost_v2(&mut raw, RUN_BYTES as usize)
    }) {
        report("cuMemAllocHost, 1 GiB", ms(t), "ms");
        // SAFETY: allocated just above.
        unsafe { sys::cuMemFreeHost(raw) };
    }

    let layout = std::alloc::Layout::from_size_align(RUN_BYTES as usize, 2 * MIB as usize).unwrap();
    let t = Instant::now();
    // SAFETY: a non-zero size; freed below with the same layout.
    let memory = unsafe { std::alloc::alloc(layout) };
    if memory.is_null() {
        return println!("COST sleep: 1 GiB of host memory could not be allocated");
    }
    // SAFETY: `memory` is RUN_BYTES long; madvise only advises, and the bytes are ours to write.
    unsafe {
        libc::madvise(memory.cast(), RUN_BYTES as usize, libc::MADV_HUGEPAGE);
        std::ptr::write_bytes(memory, 0, RUN_BYTES as usize);
    }
    let touched_ms = ms(t);
    let t = Instant::now();
    // SAFETY: the range is ours and stays allocated until it is unregistered.
    let registered = unsafe { sys::cuMemHostRegister_v2(memory.cast(), RUN_BYTES as usize, 0) };
    if ok("cuMemHostRegister", registered) {
        report(
            "huge-page memory: allocate + touch, 1 GiB",
            touched_ms,
            "ms",
        );
        report("huge-page memory: cuMemHostRegister, 1 GiB", ms(t), "ms");
        // SAFETY: registered above.
        unsafe { sys::cuMemHostUnregister(memory.cast()) };
    }
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(memory, layout) };
}
