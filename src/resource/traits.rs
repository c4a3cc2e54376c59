//! What a resource is, for the device's policy: [`Traits`] (the contract suite reads them where
//! resources legitimately differ).
//!
//! Invariant: a resource's traits never change while it lives.

/// What a resource is, for the device's policy; fixed for the resource's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traits {
    /// What it is, for messages ("pool", "small-block pool", "virtual memory resource", ...).
    pub label: &'static str,
    /// Freed blocks may wait in the device's cache for reuse on their stream; if not, they go
    /// straight back.
    pub cacheable: bool,
    /// Its blocks are streampool's to hold: they count against the memory limit (held bytes),
    /// and a block other streams used (record_stream) waits for them before it goes back. False
    /// for graph memory, which belongs to its graph.
    pub held: bool,
    /// Its blocks can be exported to other processes ([`Capabilities::export`]).
    ///
    /// [`Capabilities::export`]: super::Capabilities::export
    pub shareable: bool,
    /// It can reuse freed memory only once it was given back (a CUDA pool coalesces only what is
    /// returned to it): the device then returns cached blocks, and trims, before it grows. A
    /// resource that manages its own holes says false.
    pub returns_before_growth: bool,
    /// Its [`Resource::try_allocate`] and [`Resource::try_deallocate`] may serve (the contract
    /// suite checks them against `allocate` and `deallocate`). The device calls them inside its
    /// own lock section before anything else where the source is the vmm backend's one
    /// resource, which it holds by its own type ([`Sources::fast_own`]).
    ///
    /// [`Sources::fast_own`]: super::Sources::fast_own
    ///
    /// [`Resource::try_allocate`]: super::Resource::try_allocate
    /// [`Resource::try_deallocate`]: super::Resource::try_deallocate
    pub fast_path: bool,
    /// Memory freed on one stream serves other streams once the work queued before the free has
    /// completed (a synchronisation at the latest). False: a freed range serves only the stream
    /// that freed it, as in PyTorch's private (graph) pools.
    pub reuses_across_streams: bool,
    /// [`Resource::trim`] gives back what it reserves beyond its live blocks (to the granule it
    /// grows by). False: it keeps its memory until it is released otherwise (a graph pool's
    /// segments go back once nobody uses the pool).
    ///
    /// [`Resource::trim`]: super::Resource::trim
    pub trims: bool,
    /// A deallocation whose size is not the block's is refused and changes nothing. False: the
    /// size is not known to it and the block goes back whole, whatever size is given (CUDA's
    /// `cuMemFreeAsync` takes none; the device passes the size it recorded).
    pub checks_free_size: bool,
    /// The step its reserved memory grows by when it lacks room for a block (a CUDA pool's 2 MiB,
    /// the vmm resource's page; 1: by what the block needs). Under a memory limit the device
    /// rounds the growth of a resource that grows by itself up to it before the check.
    pub growth_granule_bytes: u64,
    /// It applies the frees it was given only at a synchronisation (a CUDA pool: what its
    /// `trim` can give back is what was freed before the device last synchronised), so the
    /// device synchronises before it trims it at idle. False: its `trim` gives back everything
    /// free by itself (waiting for the GPU where it must).
    pub frees_applied_at_sync: bool,
    /// Its [`Resource::deallocate_idle`] makes a block whose streams have all finished ready
    /// for every stream at once; the device asks the driver whether the block's own stream has
    /// finished before it hands one back so. False: that is a plain free, and nobody asks.
    ///
    /// [`Resource::deallocate_idle`]: super::Resource::deallocate_idle
    pub takes_idle_blocks: bool,
    /// It keeps what it reserves from the device under the device's memory limit itself (it
    /// shares the limit and checks its growth against it). False: the device's check of the
    /// bytes held is all there is, and one who allocates from it beyond its blocks (a memory
    /// pool's segment) checks its reserved bytes against the limit first.
    pub keeps_under_limit: bool,
}
