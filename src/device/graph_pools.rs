//! PyTorch's memory pools on one device (`torch.cuda.graph` captures, `torch.compile`'s CUDA
//! graph trees, `torch.cuda.MemPool`) as a part the device owns: the pools, each a source of the
//! device's table ([`GraphPoolResource`]), and the routes PyTorch opens to them
//! ([`super::pool_routes`]). What the part needs of its device is one narrow interface,
//! [`PoolDevice`] (the table of sources, the resource new pools take their segments from); the
//! ledger's side of a pool's blocks — booking them, the limit, out of memory — is the
//! device's ([`super::pool_blocks`]).
//!
//! Invariants: a pool's users, and the allocations in it under way, are counted under the pools'
//! lock in the same section that finds or makes it, so a flush never drops a pool someone is
//! about to use; a pool gives back only
//! segments taken while nobody used it, and only after a device synchronisation that began after
//! they were taken; it leaves the table once it holds nothing; the pools' lock is never held
//! while a driver call is made or the device's lock is taken.

use super::pool_routes::{Routes, StreamFilter};
use crate::driver::{DevicePtr, Driver, Stream};
use crate::error::{Error, Result};
use crate::resource::foreign::{ForeignFree, ForeignMalloc, ForeignResource};
use crate::resource::graph_pool::{GraphPoolResource, PoolId, Segment, SegmentLimit};
use crate::resource::{Resource, SourceId};
use crate::sync::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// A pool and its place in the device's table of sources.
pub(super) type Entry = (SourceId, Arc<GraphPoolResource>);

/// Segments taken from pools nobody used, to give back after a synchronisation.
pub(super) type Taken = Vec<(Arc<GraphPoolResource>, Vec<Segment>)>;

/// What the pools need of their device.
pub(super) trait PoolDevice: Send + Sync {
    /// Adds a pool to the device's table of sources; its id.
    fn add_source(&self, resource: Arc<dyn Resource>) -> Result<SourceId>;
    /// Removes a pool's source (it leaves once no block of it is held).
    fn remove_source(&self, id: SourceId) -> Result<()>;
    /// The resource a new pool takes its segments from: the device's own.
    fn own_resource(&self) -> Result<Arc<dyn Resource>>;
    /// The device's memory limit and the resources it covers, as a pool's segments meet it.
    fn segment_limit(&self) -> Result<SegmentLimit>;
}

/// What to do with a pool's count of users when it is found or made.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Users {
    /// Leave it (a look-up).
    Keep,
    /// One more, in the same locked section that finds or makes the pool.
    AddOne,
    /// An allocation in it begins, in that locked section ([`GraphPool::begin_allocating`]);
    /// the caller ends it.
    ///
    /// [`GraphPool::begin_allocating`]: crate::resource::graph_pool::GraphPool::begin_allocating
    Allocating,
}

impl Users {
    /// Counts this use of `pool`.
    fn count(self, pool: &GraphPoolResource) {
        match self {
            Users::Keep => {}
            Users::AddOne => pool.with(|p| p.incref()),
            Users::Allocating => pool.with(|p| p.begin_allocating()),
        }
    }

    /// Takes this use of `pool` back (its caller fails).
    fn uncount(self, pool: &GraphPoolResource) {
        match self {
            Users::Keep => {}
            Users::AddOne => {
                let _ = pool.with(|p| p.decref());
            }
            Users::Allocating => pool.with(|p| p.end_allocating()),
        }
    }
}

#[derive(Default)]
struct Registry {
    pools: HashMap<PoolId, Entry>,
    /// The pools' own stream of the device, made on first need.
    own_stream: Option<Stream>,
}

/// The memory pools of one device and the routes to them.
pub struct GraphPools {
    device: usize,
    driver: Arc<dyn Driver>,
    /// The device owning this part (weak: the device owns the part).
    host: Weak<dyn PoolDevice>,
    registry: Mutex<Registry>,
    routes: Routes,
}

impl GraphPools {
    pub(super) fn new(
        device: usize,
        driver: Arc<dyn Driver>,
        host: Weak<dyn PoolDevice>,
    ) -> GraphPools {
        GraphPools {
            device,
            driver,
            host,
            registry: Mutex::new(Registry::default()),
            routes: Routes::default(),
        }
    }

    fn host(&self) -> Result<Arc<dyn PoolDevice>> {
        self.host.upgrade().ok_or_else(|| {
            Error::Internal(format!(
                "device {}: its memory pools outlived it",
                self.device
            ))
        })
    }

    /// Pool `id`, if it exists.
    pub(super) fn existing(&self, id: PoolId) -> Result<Entry> {
        let registry = self.registry.lock();
        registry
            .pools
            .get(&id)
            .map(|(source, pool)| (*source, Arc::clone(pool)))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "device {}: no memory pool {id:?} (it was never used, or was released and \
                     emptied)",
                    self.device
                ))
            })
    }

    /// Pool `id`, made now if it does not exist, its users changed as `users` says; a pool made
    /// now takes its segments from `parent` (a `MemPool`'s own allocator), else from the
    /// device's own resource.
    pub(super) fn for_use(
        &self,
        id: PoolId,
        users: Users,
        parent: Option<Arc<dyn Resource>>,
    ) -> Result<Entry> {
        let own_stream = {
            let registry = self.registry.lock();
            if let Some((source, pool)) = registry.pools.get(&id) {
                users.count(pool);
                return Ok((*source, Arc::clone(pool)));
            }
            registry.own_stream
        };
        // Made outside the pools' lock (a driver call, the device's lock); a thread that made
        // the same pool meanwhile wins, and this one's source leaves the table again.
        let host = self.host()?;
        // The device is set up first (its own resource), as for any allocation.
        let own = host.own_resource()?;
        // The device's limit covers its own resources' memory, not a MemPool allocator's.
        let limit = match parent {
            Some(_) => None,
            None => Some(host.segment_limit()?),
        };
        let parent = parent.unwrap_or(own);
        let own_stream = match own_stream {
            Some(s) => s,
            None => self.driver.stream_create(self.device)?,
        };
        let pool = Arc::new(GraphPoolResource::new(
            self.device,
            Arc::clone(&self.driver),
            parent,
            own_stream,
            limit,
        ));
        let source = host.add_source(Arc::clone(&pool) as Arc<dyn Resource>)?;
        let (entry, lost) = {
            let mut registry = self.registry.lock();
            // The first stream made is the device's for good (another, unused, lives on with the
            // process, as streams the driver makes do).
            registry.own_stream.get_or_insert(own_stream);
            let (entry, lost) = match registry.pools.get(&id) {
                Some((s, p)) => ((*s, Arc::clone(p)), Some(source)),
                None => {
                    registry.pools.insert(id, (source, Arc::clone(&pool)));
                    ((source, pool), None)
                }
            };
            users.count(&entry.1);
            (entry, lost)
        };
        if let Some(unused) = lost {
            if let Err(e) = host.remove_source(unused) {
                users.uncount(&entry.1);
                return Err(e);
            }
        }
        Ok(entry)
    }

    /// `createOrIncrefPool`: one more user of pool `id` (a `torch.cuda.MemPool`).
    pub fn create_or_incref(&self, id: PoolId) -> Result<()> {
        self.for_use(id, Users::AddOne, None).map(|_| ())
    }

    /// `createOrIncrefPool` with an allocator of the pool's own (`torch.cuda.MemPool(allocator)`):
    /// a pool made now takes its segments from that allocator and gives them back to it; an
    /// existing pool gets one more user and keeps its source.
    ///
    /// # Safety
    /// As `ForeignResource::new`: a matching pair, callable from any thread while the pool may
    /// hold memory of it, that does not unwind.
    pub unsafe fn create_or_incref_with_allocator(
        &self,
        id: PoolId,
        malloc: ForeignMalloc,
        free: ForeignFree,
    ) -> Result<()> {
        // SAFETY: as the caller promises.
        let parent = unsafe { ForeignResource::new(self.device, malloc, free) };
        self.for_use(id, Users::AddOne, Some(Arc::new(parent)))
            .map(|_| ())
    }

    /// How many users pool `id` has (0 for a pool that does not exist).
    pub fn use_count(&self, id: PoolId) -> u32 {
        self.existing(id)
            .map_or(0, |(_, p)| p.with(|p| p.use_count()))
    }

    /// `setNoSplit`: blocks of pool `id` take whole free ranges.
    pub fn set_no_split(&self, id: PoolId) -> Result<()> {
        self.for_use(id, Users::Keep, None)?
            .1
            .with(|p| p.set_no_split());
        Ok(())
    }

    /// `setUseOnOOM`: whether the pool's free memory may serve allocations outside any pool
    /// that ran out of memory (`DeviceAllocator::allocate_from_oom_pools`). Turning it off
    /// for a pool that does not exist (any more) does nothing.
    pub fn set_use_on_oom(&self, id: PoolId, on: bool) -> Result<()> {
        let pool = match on {
            true => self.for_use(id, Users::Keep, None)?,
            false => match self.existing(id) {
                Ok(pool) => pool,
                Err(_) => return Ok(()),
            },
        };
        pool.1.with(|p| p.set_use_on_oom(on));
        Ok(())
    }

    /// `beginAllocateToPool`: allocations `filter` claims go to pool `id` (one more user) until
    /// [`GraphPools::end_allocate_to_pool`].
    pub fn begin_allocate_to_pool(&self, id: PoolId, filter: Arc<dyn StreamFilter>) -> Result<()> {
        self.for_use(id, Users::AddOne, None)?;
        self.routes.begin(id, filter);
        Ok(())
    }

    /// `endAllocateToPool`: the latest route to pool `id` ends.
    pub fn end_allocate_to_pool(&self, id: PoolId) -> Result<()> {
        let filter = self.routes.end(id, self.device)?;
        drop(filter); // PyTorch's std::function copy, destroyed outside every lock
        Ok(())
    }

    /// `releasePool`: one user less. The pool's memory goes back at a synchronising flush once
    /// nobody uses it (its blocks still live stay until freed).
    pub fn release_pool(&self, id: PoolId) -> Result<()> {
        self.existing(id)?.1.with(|p| p.decref())?;
        Ok(())
    }

    /// The pool that claims an allocation on `stream`, if any (PyTorch's filters run here).
    #[inline]
    pub fn claiming(&self, stream: Stream) -> Option<PoolId> {
        self.routes.claim(stream)
    }

    /// True while a route is open: PyTorch opens one before it begins a graph capture.
    pub(super) fn any_route_open(&self) -> bool {
        self.routes.any_open()
    }

    /// The segments of pool `id`: (address, bytes).
    pub fn segments(&self, id: PoolId) -> Result<Vec<(DevicePtr, u64)>> {
        let (_, pool) = self.existing(id)?;
        Ok(pool.with(|p| p.segments().map(|s| (s.ptr, s.bytes)).collect()))
    }

    /// The ids of the pools.
    pub fn ids(&self) -> Vec<PoolId> {
        self.registry.lock().pools.keys().copied().collect()
    }

    /// Every pool, with its table id (a snapshot).
    pub(super) fn entries(&self) -> Vec<Entry> {
        self.registry.lock().pools.values().cloned().collect()
    }

    /// The table ids of the pools.
    pub(super) fn source_ids(&self) -> Vec<SourceId> {
        let registry = self.registry.lock();
        registry.pools.values().map(|(source, _)| *source).collect()
    }

    /// Before a flush's synchronisation: the free segments of every pool nobody uses, taken out
    /// of the pools (no replay can use them any more: no graph holds the pool).
    pub(super) fn take_unused_segments(&self) -> Taken {
        self.entries()
            .into_iter()
            .map(|(_, pool)| {
                let segments = pool.take_free_segments_if_unused();
                (pool, segments)
            })
            .filter(|(_, segments)| !segments.is_empty())
            .collect()
    }

    /// After the synchronisation: the taken segments go back to where they came from, and pools
    /// left with nothing leave the table. The bytes given back.
    pub(super) fn give_back_segments(&self, taken: Taken) -> Result<u64> {
        let mut released_bytes = 0;
        let mut first_error = Ok(());
        for (pool, segments) in taken {
            match pool.give_back_segments(segments) {
                Ok(bytes) => released_bytes += bytes,
                Err(e) => first_error = first_error.and(Err(e)),
            }
        }
        // The device first: a pool leaves the registry only with its source then removed.
        let host = match self.host() {
            Ok(host) => host,
            Err(e) => return first_error.and(Err(e)).map(|()| released_bytes),
        };
        let gone: Vec<SourceId> = {
            let mut registry = self.registry.lock();
            let gone: Vec<(PoolId, SourceId)> = registry
                .pools
                .iter()
                .filter(|(_, (_, p))| p.with(|p| p.is_unused() && p.reserved_bytes() == 0))
                .map(|(id, (source, _))| (*id, *source))
                .collect();
            gone.iter()
                .map(|(id, source)| {
                    registry.pools.remove(id);
                    *source
                })
                .collect()
        };
        for source in gone {
            first_error = first_error.and(host.remove_source(source));
        }
        first_error.map(|()| released_bytes)
    }
}
