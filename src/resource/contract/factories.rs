//! The resources the contract runs against, one factory each, on device 0 of the simulator: the
//! CUDA pool in its roles, the shareable pool, the virtual-memory resource, managed memory,
//! PyTorch graph pools over the device's own resource (pool or vmm), graph memory, and a foreign
//! allocator's
//! malloc/free pair (`torch.cuda.MemPool(allocator)`), here a stream-ordered pool of the
//! simulator behind two C functions.
//!
//! Invariant: a factory that fails leaves nothing made; a factory's teardown gives back what its
//! resource holds beyond its blocks, so that the strict simulator finds no leak.

use super::{Made, MEMORY_BYTES};
use crate::config::Settings;
use crate::driver::sim::SimDriver;
use crate::driver::{DevicePtr, Driver, PoolAttr, PoolDriver, PoolHandle, Stream};
use crate::error::Result;
use crate::history::{History, Recorder};
use crate::resource::cuda_pool::{CudaPoolResource, PoolRole};
use crate::resource::driver_pool::DriverPoolResource;
use crate::resource::foreign::ForeignResource;
use crate::resource::graph_pool::GraphPoolResource;
use crate::resource::managed::ManagedResource;
use crate::resource::vmm::{VmmResource, VmmSettings};
use crate::resource::{shareable_pool as make_shareable_pool, Resource};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

fn driver(sim: &Arc<SimDriver>) -> Arc<dyn Driver> {
    sim.clone()
}

fn plain(resource: Arc<dyn Resource>) -> Made {
    Made {
        resource,
        teardown: None,
    }
}

fn settings() -> crate::config::SourceSettings {
    Settings::default().for_device(MEMORY_BYTES).sources
}

fn pool_in(sim: &Arc<SimDriver>, role: PoolRole) -> Result<Arc<dyn Resource>> {
    let pool = CudaPoolResource::create(&driver(sim), 0, &settings().pool, role)?;
    Ok(Arc::new(pool))
}

/// The device's own CUDA pool (the `pool` backend's).
pub(super) fn cuda_pool(sim: &Arc<SimDriver>) -> Result<Made> {
    pool_in(sim, PoolRole::OWN).map(plain)
}

/// The device's one pool under `STREAMPOOL_IPC`: shareable, and cached.
pub(super) fn cuda_pool_shared(sim: &Arc<SimDriver>) -> Result<Made> {
    pool_in(sim, PoolRole::SHARED_OWN).map(plain)
}

/// The pool of `streampool.shareable()`.
pub(super) fn shareable_pool(sim: &Arc<SimDriver>) -> Result<Made> {
    make_shareable_pool(&driver(sim), 0, &settings().pool).map(plain)
}

fn vmm_resource(sim: &Arc<SimDriver>) -> Result<Arc<dyn Resource>> {
    let driver = driver(sim);
    let settings = VmmSettings::resolve(&settings().vmm, driver.as_ref(), 0, MEMORY_BYTES)?;
    let limit_bytes = Arc::new(AtomicU64::new(u64::MAX));
    let recorder = Arc::new(Recorder::new(0, Arc::new(History::default())));
    let vmm = VmmResource::create(&driver, 0, &settings, MEMORY_BYTES, limit_bytes, recorder)?;
    Ok(vmm)
}

/// The `vmm` backend's resource.
pub(super) fn vmm(sim: &Arc<SimDriver>) -> Result<Made> {
    vmm_resource(sim).map(plain)
}

/// A PyTorch graph pool whose segments come from `parent`; its teardown gives them back, as the
/// device does once nobody uses the pool.
fn graph_pool_over(sim: &Arc<SimDriver>, parent: Arc<dyn Resource>) -> Result<Made> {
    let driver = driver(sim);
    let own_stream = driver.stream_create(0)?;
    let pool = Arc::new(GraphPoolResource::new(
        0,
        driver.clone(),
        parent,
        own_stream,
        None,
    ));
    let held = Arc::clone(&pool);
    let teardown = move || {
        let segments = held.take_free_segments_if_unused();
        driver.synchronize(0).expect("cuCtxSynchronize");
        held.give_back_segments(segments)
            .expect("the segments go back");
        driver.synchronize(0).expect("cuCtxSynchronize");
    };
    Ok(Made {
        resource: pool,
        teardown: Some(Box::new(teardown)),
    })
}

pub(super) fn graph_pool_over_pool(sim: &Arc<SimDriver>) -> Result<Made> {
    graph_pool_over(sim, pool_in(sim, PoolRole::OWN)?)
}

pub(super) fn graph_pool_over_vmm(sim: &Arc<SimDriver>) -> Result<Made> {
    graph_pool_over(sim, vmm_resource(sim)?)
}

/// The `managed` backend's resource.
pub(super) fn managed(sim: &Arc<SimDriver>) -> Result<Made> {
    Ok(plain(Arc::new(ManagedResource::new(
        &driver(sim),
        0,
        u64::MAX,
        Arc::new(AtomicU64::new(u64::MAX)),
        u64::MAX,
    ))))
}

/// Graph memory: allocations on a capturing stream, from the driver's own pool.
pub(super) fn graph_memory(sim: &Arc<SimDriver>) -> Result<Made> {
    Ok(plain(Arc::new(DriverPoolResource::graph_memory(
        &driver(sim),
        0,
    ))))
}

/// What is behind one foreign allocator: the simulator, its pool, and the frees it refused.
#[derive(Clone)]
struct ForeignPool {
    sim: Weak<SimDriver>,
    pool: PoolHandle,
    refused_frees: Arc<AtomicU64>,
}

/// The foreign allocators by the device number the resource passes their functions (each case
/// gets a number of its own).
static FOREIGN: Mutex<Option<HashMap<c_int, ForeignPool>>> = Mutex::new(None);
static NEXT_FOREIGN: AtomicI32 = AtomicI32::new(1000);

fn foreign_pool(key: c_int) -> Option<(Arc<SimDriver>, ForeignPool)> {
    let table = FOREIGN.lock().unwrap_or_else(|e| e.into_inner());
    let foreign = table.as_ref()?.get(&key)?.clone();
    Some((foreign.sim.upgrade()?, foreign))
}

/// `void* malloc(size_t, int device, cudaStream_t)`: PyTorch's pluggable allocator's, over a
/// stream-ordered pool of the simulator; NULL when it has no memory.
unsafe extern "C" fn foreign_malloc(size: usize, key: c_int, stream: *mut c_void) -> *mut c_void {
    let Some((sim, foreign)) = foreign_pool(key) else {
        return std::ptr::null_mut();
    };
    match sim.alloc_async(0, foreign.pool, size as u64, Stream(stream as usize)) {
        Ok(ptr) => ptr.0 as *mut c_void,
        Err(_) => std::ptr::null_mut(),
    }
}

/// `void free(void*, size_t, int device, cudaStream_t)`, stream-ordered. It cannot report a
/// failure: it tries once more (an injected fault fails one call), and a pointer it still cannot
/// free is counted (the case's end checks), never a panic across the C signature.
unsafe extern "C" fn foreign_free(ptr: *mut c_void, _size: usize, key: c_int, stream: *mut c_void) {
    if let Some((sim, foreign)) = foreign_pool(key) {
        let free = || sim.free_async(0, DevicePtr(ptr as u64), Stream(stream as usize));
        if free().or_else(|_| free()).is_err() {
            foreign.refused_frees.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A `torch.cuda.MemPool(allocator)`'s own allocator; its teardown destroys the pool behind it.
pub(super) fn foreign(sim: &Arc<SimDriver>) -> Result<Made> {
    let pool = sim.pool_create(0, u64::MAX, false)?;
    // An allocator that keeps what it reserved (the pool's default threshold gives it back at
    // every synchronisation).
    if let Err(e) = sim.pool_set_attr(0, pool, PoolAttr::ReleaseThresholdBytes(u64::MAX)) {
        sim.pool_destroy(0, pool)?;
        return Err(e);
    }
    let key = NEXT_FOREIGN.fetch_add(1, Ordering::Relaxed);
    let refused_frees = Arc::new(AtomicU64::new(0));
    let foreign = ForeignPool {
        sim: Arc::downgrade(sim),
        pool,
        refused_frees: Arc::clone(&refused_frees),
    };
    let mut table = FOREIGN.lock().unwrap_or_else(|e| e.into_inner());
    table.get_or_insert_with(HashMap::new).insert(key, foreign);
    drop(table);
    // SAFETY: the two functions are a matching pair of the pluggable allocator's signatures,
    // callable from any thread for as long as the process lives, and they do not unwind (a
    // failed allocation is NULL; a free of what they did not allocate aborts the case).
    let resource = unsafe { ForeignResource::new(key as usize, foreign_malloc, foreign_free) };
    let sim = Arc::downgrade(sim);
    let teardown = move || {
        let mut table = FOREIGN.lock().unwrap_or_else(|e| e.into_inner());
        table.get_or_insert_with(HashMap::new).remove(&key);
        if let Some(sim) = sim.upgrade() {
            sim.pool_destroy(0, pool).expect("cuMemPoolDestroy");
        }
        let refused = refused_frees.load(Ordering::Relaxed);
        assert_eq!(
            refused, 0,
            "the foreign allocator was asked to free what it did not allocate"
        );
    };
    Ok(Made {
        resource: Arc::new(resource),
        teardown: Some(Box::new(teardown)),
    })
}
