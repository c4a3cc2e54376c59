//! The allocator_ops fuzz target's input: the operations libFuzzer's bytes decode to
//! (`arbitrary`), with the values each stands for.

use super::{DEVICES, MAX_ALLOCATION_BYTES, MIB, STREAMS};
use arbitrary::Arbitrary;
use streampool::driver::sim::{SimDriver, SimFault};
use streampool::driver::Stream;

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Size {
    /// 0..=6 MiB.
    Bytes(u32),
    /// k x 512 bytes (exact cache sizes).
    Blocks(u8),
    Zero,
    /// 1 TiB: always out of memory.
    Huge,
    /// `u64::MAX - x`: whose rounding to 512 overflows 64 bits (above the maximum: out of memory).
    NearMax(u16),
    /// `MAX_ALLOCATION_BYTES - 1024 + x`: either side of the largest size accepted.
    AroundLimit(u16),
    /// Any 64-bit size.
    Any(u64),
}

impl Size {
    pub fn bytes(self) -> u64 {
        match self {
            Size::Bytes(b) => u64::from(b) % (6 * MIB + 1),
            Size::Blocks(k) => u64::from(k) * 512,
            Size::Zero => 0,
            Size::Huge => 1 << 40,
            Size::NearMax(x) => u64::MAX - u64::from(x),
            Size::AroundLimit(x) => MAX_ALLOCATION_BYTES - 1024 + u64::from(x % 2048),
            Size::Any(b) => b,
        }
    }
}

/// -1, 0, 1, 2: two simulated devices, so -1 and 2 are out of range.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct Dev(u8);

impl Dev {
    pub fn index(self) -> i64 {
        i64::from(self.0 % 4) - 1
    }
}

/// A valid device index, for the simulator's own controls.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct SimDev(u8);

impl SimDev {
    pub fn index(self) -> usize {
        usize::from(self.0) % DEVICES
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct StreamSel(u8);

impl StreamSel {
    pub fn stream(self) -> Stream {
        STREAMS[usize::from(self.0) % STREAMS.len()]
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum FreeTarget {
    /// A live pointer on its own device.
    Live(u16),
    /// A live pointer on another (or an invalid) device.
    LiveOn(u16, Dev),
    Null(Dev),
    /// An address near the simulator's allocations that may or may not be live.
    Unknown(u32, Dev),
    /// live ptr + 512.
    Interior(u16),
    /// The pointer freed last, again.
    DoubleFree,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Fraction {
    Of255(u8),
    Zero,
    One,
    OnePointFive,
    Negative,
    NaN,
    Infinity,
}

impl Fraction {
    pub fn value(self) -> f64 {
        match self {
            Fraction::Of255(x) => f64::from(x) / 255.0,
            Fraction::Zero => 0.0,
            Fraction::One => 1.0,
            Fraction::OnePointFive => 1.5,
            Fraction::Negative => -0.25,
            Fraction::NaN => f64::NAN,
            Fraction::Infinity => f64::INFINITY,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Bytes {
    Zero,
    /// x * 64 KiB.
    Chunks(u16),
    Max,
}

impl Bytes {
    pub fn value(self) -> u64 {
        match self {
            Bytes::Zero => 0,
            Bytes::Chunks(x) => u64::from(x) << 16,
            Bytes::Max => u64::MAX,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    PoolCreate,
    PoolSetAttr,
    Alloc,
    Free,
    EventCreate,
    EventRecord,
    Synchronize,
    AddressReserve,
    MemCreate,
    MemMap,
    MemUnmap,
    MemRelease,
    SetAccess,
    MemExport,
}

pub const FAULTS: [Fault; 14] = [
    Fault::PoolCreate,
    Fault::PoolSetAttr,
    Fault::Alloc,
    Fault::Free,
    Fault::EventCreate,
    Fault::EventRecord,
    Fault::Synchronize,
    Fault::AddressReserve,
    Fault::MemCreate,
    Fault::MemMap,
    Fault::MemUnmap,
    Fault::MemRelease,
    Fault::SetAccess,
    Fault::MemExport,
];

impl Fault {
    pub fn sim(self) -> SimFault {
        match self {
            Fault::PoolCreate => SimFault::PoolCreate,
            Fault::PoolSetAttr => SimFault::PoolSetAttr,
            Fault::Alloc => SimFault::Alloc,
            Fault::Free => SimFault::Free,
            Fault::EventCreate => SimFault::EventCreate,
            Fault::EventRecord => SimFault::EventRecord,
            Fault::Synchronize => SimFault::Synchronize,
            Fault::AddressReserve => SimFault::AddressReserve,
            Fault::MemCreate => SimFault::MemCreate,
            Fault::MemMap => SimFault::MemMap,
            Fault::MemUnmap => SimFault::MemUnmap,
            Fault::MemRelease => SimFault::MemRelease,
            Fault::SetAccess => SimFault::SetAccess,
            Fault::MemExport => SimFault::MemExport,
        }
    }

    /// Consumes one pending fault of this kind if there is one; returns whether there was.
    pub fn probe(self, sim: &SimDriver) -> bool {
        sim.take_injected(self.sim())
    }
}

/// One fuzz input: which backend serves large blocks, and the operations.
#[derive(Arbitrary, Debug)]
pub struct Run {
    /// `STREAMPOOL_BACKEND=vmm` (with the background releaser off, so that a run is
    /// deterministic and injected faults fire only inside operations).
    pub vmm: bool,
    pub ops: Vec<Op>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Op {
    Malloc {
        size: Size,
        device: Dev,
        stream: StreamSel,
    },
    Free(FreeTarget),
    RecordStream {
        pick: u16,
        stream: StreamSel,
    },
    RecordStreamUnknown {
        offset: u32,
        stream: StreamSel,
    },
    EmptyCache,
    SetReleaseThreshold {
        device: Dev,
        bytes: Bytes,
    },
    Trim {
        device: Dev,
        keep: Bytes,
    },
    SetMemoryFraction {
        device: Dev,
        fraction: Fraction,
    },
    ResetPeaks {
        device: Dev,
    },
    CompleteStream {
        device: SimDev,
        stream: StreamSel,
    },
    CompleteAll,
    BeginCapture {
        device: SimDev,
        stream: StreamSel,
    },
    EndCapture {
        pick: u8,
    },
    InjectFault(Fault),
    /// `streampool.sleep(level)` (levels other than 1 and 2 are refused).
    Sleep {
        device: Dev,
        level: u8,
    },
    Wake {
        device: Dev,
    },
    /// A malloc inside `streampool.shareable()`: from the device's shareable pool.
    MallocShareable {
        size: Size,
        device: Dev,
        stream: StreamSel,
    },
    /// Export a live block; if that succeeds, import it here (as another process would), close
    /// the import and release the export.
    ExportImport {
        pick: u16,
        stream: StreamSel,
    },
    RecordHistory {
        on: bool,
    },
    /// Export a live block page by page (the vmm backend; `streampool.share()` under a plain
    /// `install()`), keeping the export until `ReleaseExport`: the device may not sleep while
    /// an export of a live block is held.
    ExportPages {
        pick: u16,
        stream: StreamSel,
    },
    /// Every importer closed an export of pages: release it (its block may be gone).
    ReleaseExport {
        pick: u8,
    },
}
