//! The rig a case drives its resource through: a ledger of the blocks the resource handed out,
//! each checked and used on the GPU as a program would use it, and the end of the case, which
//! gives everything back and lets the strict simulator judge the leaks.
//!
//! Invariant: the ledger holds exactly the blocks the resource handed out and has not taken
//! back; every block in it starts on [`ALIGNMENT_BYTES`], overlaps no other, and was touched by
//! its stream when it was handed out and again just before it was given back (the last kernel
//! that used it), so that the simulator sees any later use of its bytes by another stream.

use super::{simulator, Factory, ALIGNMENT_BYTES};
use crate::driver::sim::SimDriver;
use crate::driver::{DevicePtr, Driver, Stream};
use crate::error::Result;
use crate::resource::{Resource, Traits, Usage};
use std::sync::Arc;

/// The streams cases use (none is the legacy default stream).
pub(super) const S: Stream = Stream(0x51);
pub(super) const T: Stream = Stream(0x52);
pub(super) const U: Stream = Stream(0x53);

/// A block the resource handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Block {
    pub ptr: DevicePtr,
    pub bytes: u64,
    pub stream: Stream,
}

/// What a call that changes nothing must leave as it was: the resource's usage and the device
/// memory the simulator sees taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Snapshot {
    pub usage: Usage,
    pub physical_bytes: u64,
    pub outstanding_bytes: u64,
}

pub(super) struct Rig {
    pub sim: Arc<SimDriver>,
    pub driver: Arc<dyn Driver>,
    pub resource: Arc<dyn Resource>,
    pub traits: Traits,
    pub live: Vec<Block>,
    teardown: Option<Box<dyn FnOnce()>>,
}

impl Rig {
    /// The resource `make` makes, on a fresh simulator.
    pub fn new(make: Factory) -> Rig {
        Rig::on(simulator(), make).expect("the resource is made")
    }

    /// The resource `make` makes on `sim`.
    pub fn on(sim: Arc<SimDriver>, make: Factory) -> Result<Rig> {
        let made = make(&sim)?;
        let driver: Arc<dyn Driver> = sim.clone();
        Ok(Rig {
            traits: made.resource.traits(),
            sim,
            driver,
            resource: made.resource,
            live: Vec::new(),
            teardown: made.teardown,
        })
    }

    pub fn label(&self) -> &'static str {
        self.traits.label
    }

    /// A block of `bytes` on `stream`, checked and used; out of memory (or an injected fault) is
    /// the resource's error.
    pub fn try_alloc(&mut self, bytes: u64, stream: Stream) -> Result<DevicePtr> {
        let ptr = self.resource.allocate(bytes, stream)?;
        self.accept(ptr, bytes, stream);
        Ok(ptr)
    }

    /// A block of `bytes` on `stream`, which the resource must serve.
    pub fn alloc(&mut self, bytes: u64, stream: Stream) -> DevicePtr {
        self.try_alloc(bytes, stream).unwrap_or_else(|e| {
            panic!("{}: {bytes} B on {stream:#x}: {e}", self.label());
        })
    }

    /// Takes `ptr`, just handed out for `bytes` on `stream`, into the ledger: it must be aligned,
    /// overlap no live block, and be usable by `stream` now.
    pub fn accept(&mut self, ptr: DevicePtr, bytes: u64, stream: Stream) {
        let label = self.label();
        assert!(
            ptr != DevicePtr::NULL && ptr.0.is_multiple_of(ALIGNMENT_BYTES),
            "{label}: {ptr:#x} is not a {ALIGNMENT_BYTES}-byte aligned block"
        );
        let end = ptr
            .0
            .checked_add(bytes)
            .expect("a block inside the address space");
        if let Some(other) = (self.live.iter()).find(|b| b.ptr.0 < end && ptr.0 < b.ptr.0 + b.bytes)
        {
            panic!("{label}: {ptr:#x}+{bytes} on {stream:#x} overlaps the live block {other:x?}");
        }
        self.use_on_gpu(ptr, bytes, stream);
        self.live.push(Block { ptr, bytes, stream });
    }

    /// Work on `stream` uses `[ptr, ptr + bytes)`, as a kernel would.
    pub fn use_on_gpu(&self, ptr: DevicePtr, bytes: u64, stream: Stream) {
        if let Err(e) = self.sim.touch(0, 0, ptr, bytes, stream) {
            panic!("{}: {ptr:#x}+{bytes} on {stream:#x}: {e}", self.label());
        }
    }

    /// Every live block is used again by its stream (nothing under them was taken away).
    pub fn use_all(&self) {
        for b in &self.live {
            self.use_on_gpu(b.ptr, b.bytes, b.stream);
        }
    }

    /// The live block at `ptr`.
    pub fn block(&self, ptr: DevicePtr) -> Block {
        *self
            .live
            .iter()
            .find(|b| b.ptr == ptr)
            .unwrap_or_else(|| panic!("{ptr:#x} is not a live block of the case"))
    }

    /// Removes `ptr` from the ledger (the resource took it back some other way).
    pub fn forget(&mut self, ptr: DevicePtr) {
        self.live.retain(|b| b.ptr != ptr);
    }

    /// Gives the block at `ptr` back on its stream, after its last use there; an error leaves it
    /// live (the resource's contract: the block is still the caller's).
    pub fn try_free(&mut self, ptr: DevicePtr) -> Result<()> {
        let b = self.block(ptr);
        self.use_on_gpu(b.ptr, b.bytes, b.stream);
        self.resource.deallocate(b.ptr, b.bytes, b.stream)?;
        self.forget(ptr);
        Ok(())
    }

    /// Gives the block at `ptr` back, which the resource must take.
    pub fn free(&mut self, ptr: DevicePtr) {
        if let Err(e) = self.try_free(ptr) {
            panic!("{}: freeing {ptr:#x}: {e}", self.label());
        }
    }

    /// Gives every live block back.
    pub fn free_all(&mut self) {
        for b in self.live.clone() {
            self.free(b.ptr);
        }
    }

    pub fn live_bytes(&self) -> u64 {
        self.live.iter().map(|b| b.bytes).sum()
    }

    /// The device's free memory (what the simulator has not given to any resource).
    pub fn device_free_bytes(&self) -> u64 {
        self.driver.mem_info(0).expect("cuMemGetInfo").free_bytes
    }

    pub fn usage(&self) -> Usage {
        self.resource.usage().expect("usage")
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            usage: self.usage(),
            physical_bytes: self.sim.physical_bytes(0),
            outstanding_bytes: self.sim.outstanding_bytes(),
        }
    }

    /// The resource's usage agrees with the ledger: a resource whose blocks it holds has at
    /// least the live bytes in use and reserves at least what is in use; one whose blocks are
    /// not its own (graph memory) reports nothing.
    pub fn check_usage(&self) {
        let (usage, live, label) = (self.usage(), self.live_bytes(), self.label());
        match self.traits.held {
            true => assert!(
                live <= usage.used_bytes && usage.used_bytes <= usage.reserved_bytes,
                "{label}: {usage:?} with {live} B live"
            ),
            false => assert_eq!(usage, Usage::default(), "{label}: its blocks are not held"),
        }
    }

    /// The device synchronises: all work completes.
    pub fn sync(&self) {
        self.driver.synchronize(0).expect("cuCtxSynchronize");
    }

    /// The end of a case: every block back, the device synchronised, the resource's own memory
    /// given back and the resource dropped; then no event may be left, and the strict simulator's
    /// leak check (when it is dropped) finds nothing.
    pub fn finish(mut self) {
        self.free_all();
        self.sync();
        if let Some(teardown) = self.teardown.take() {
            teardown();
        }
        let Rig {
            sim,
            driver,
            resource,
            ..
        } = self;
        let label = resource.traits().label;
        drop(resource);
        drop(driver);
        assert_eq!(sim.events_alive(0), 0, "{label}: events left behind");
        match Arc::try_unwrap(sim) {
            Ok(sim) => drop(sim),
            Err(_) => panic!("{label}: something still holds the simulator (a resource leaked)"),
        }
    }
}

/// A small deterministic generator (xorshift64*), so that a failing random case fails again.
pub(in crate::resource) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// A number below `n` (> 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}
