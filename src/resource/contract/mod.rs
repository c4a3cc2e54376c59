//! The contract every [`Resource`] keeps, written once and run against each resource of the
//! crate (RMM's `mr_ref_tests` shape: one suite, a factory per resource). Each case builds its
//! resource on a strict simulator that also checks races ([`SimDriver::check_races`]): every
//! block is used ("touched") by its stream after it is handed out and before it is freed, so a
//! block handed to a stream while another stream's unfinished work still uses it, a block not
//! mapped or not allocated, a misuse of the driver or a leak at the end fails the case.
//!
//! Invariant: a case asks nothing of one resource that it does not ask of all; where a resource
//! legitimately differs, the case reads it from the resource's [`Traits`] (`held`,
//! `reuses_across_streams`, `trims`, `checks_free_size`, `fast_path`,
//! `frees_applied_at_sync`, `takes_idle_blocks`) or its [`Capabilities`](super::Capabilities) (`capture_notice`),
//! never from which resource it is.
//! The factories below are the only place that names resources.

mod cases;
mod edges;
mod factories;
mod faults;
mod rig;

use super::Resource;
use crate::driver::sim::SimDriver;
use crate::error::Result;
pub(super) use rig::Rng;
use std::sync::Arc;

/// Device memory of the simulated device, in bytes.
const MEMORY_BYTES: u64 = 64 << 20;
/// Where every block starts: the allocator's promise to PyTorch (`Resource::allocate` sizes are
/// multiples of it too).
const ALIGNMENT_BYTES: u64 = 512;
/// The granule resources grow by on the simulated device (pools and pages alike).
const GRANULE_BYTES: u64 = 2 << 20;

/// A resource made for a case, and how it lets go of what it holds beyond its blocks.
pub(super) struct Made {
    pub resource: Arc<dyn Resource>,
    /// Run once every block went back and the device synchronised, before the resource is
    /// dropped: gives back what the resource keeps past its blocks (a graph pool's segments, a
    /// foreign allocator's own pool).
    pub teardown: Option<Box<dyn FnOnce()>>,
}

/// Makes the resource under test on `sim`'s device 0 (an error where an injected fault made it
/// fail; nothing may leak then either).
pub(super) type Factory = fn(&Arc<SimDriver>) -> Result<Made>;

/// The simulator every case runs on.
fn simulator() -> Arc<SimDriver> {
    Arc::new(SimDriver::new(1, MEMORY_BYTES).strict().check_races())
}

/// One module per resource, one test per case of the contract.
macro_rules! contract {
    ($($resource:ident: $factory:path),* $(,)?) => {$(
        mod $resource {
            use super::{cases, edges, factories, faults};
            const MAKE: super::Factory = $factory;
            #[test]
            fn blocks_are_aligned_sized_and_usable() {
                cases::blocks_are_aligned_sized_and_usable(MAKE)
            }
            #[test]
            fn huge_requests_are_out_of_memory_and_change_nothing() {
                cases::huge_requests_are_out_of_memory_and_change_nothing(MAKE)
            }
            #[test]
            fn live_blocks_never_overlap_under_random_use() {
                cases::live_blocks_never_overlap_under_random_use(MAKE)
            }
            #[test]
            fn a_block_freed_on_a_stream_serves_that_stream_at_once() {
                cases::a_block_freed_on_a_stream_serves_that_stream_at_once(MAKE)
            }
            #[test]
            fn a_block_freed_on_a_stream_serves_another_only_once_ordered() {
                cases::a_block_freed_on_a_stream_serves_another_only_once_ordered(MAKE)
            }
            #[test]
            fn usage_follows_the_live_blocks() {
                cases::usage_follows_the_live_blocks(MAKE)
            }
            #[test]
            fn trim_after_a_synchronisation_gives_back_what_is_free() {
                cases::trim_after_a_synchronisation_gives_back_what_is_free(MAKE)
            }
            #[test]
            fn a_trim_with_no_synchronisation_before_it_gives_back_what_its_traits_say() {
                cases::a_trim_with_no_synchronisation_before_it_gives_back_what_its_traits_say(MAKE)
            }
            #[test]
            fn exhaustion_then_recovery_after_frees() {
                cases::exhaustion_then_recovery_after_frees(MAKE)
            }
            #[test]
            fn a_block_given_back_idle_serves_another_stream_as_its_traits_say() {
                cases::a_block_given_back_idle_serves_another_stream_as_its_traits_say(MAKE)
            }
            #[test]
            fn a_capture_sees_no_call_it_forbids() {
                edges::a_capture_sees_no_call_it_forbids(MAKE)
            }
            #[test]
            fn bad_frees_are_refused_and_change_nothing() {
                edges::bad_frees_are_refused_and_change_nothing(MAKE)
            }
            #[test]
            fn the_fast_path_agrees_with_allocate_and_deallocate() {
                edges::the_fast_path_agrees_with_allocate_and_deallocate(MAKE)
            }
            #[test]
            fn threads_on_their_own_streams_share_it_safely() {
                edges::threads_on_their_own_streams_share_it_safely(MAKE)
            }
            #[test]
            fn a_failed_creation_leaks_nothing() {
                faults::a_failed_creation_leaks_nothing(MAKE)
            }
            #[test]
            fn driver_faults_leave_it_usable_and_leak_nothing() {
                faults::driver_faults_leave_it_usable_and_leak_nothing(MAKE)
            }
        }
    )*};
}

contract! {
    cuda_pool: factories::cuda_pool,
    cuda_pool_shared: factories::cuda_pool_shared,
    shareable_pool: factories::shareable_pool,
    vmm: factories::vmm,
    graph_pool_over_pool: factories::graph_pool_over_pool,
    graph_pool_over_vmm: factories::graph_pool_over_vmm,
    graph_memory: factories::graph_memory,
    foreign: factories::foreign,
    managed: factories::managed,
}
