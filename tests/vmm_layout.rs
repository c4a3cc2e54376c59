//! The virtual-memory backend's address layout, decided when a device is first used: a page size
//! larger than the device, and a device too large for the address reservation, are errors naming
//! the variable to change — not an out-of-memory error at every allocation afterwards.

use std::sync::Arc;
use streampool::config::Backend;
use streampool::driver::sim::SimDriver;
use streampool::driver::{Driver, Stream};
use streampool::units::SizeSpec;
use streampool::{Allocator, Config, Error};

const MIB: u64 = 1 << 20;

fn vmm(memory_bytes: u64, page: SizeSpec) -> (Arc<SimDriver>, Allocator) {
    let sim = Arc::new(SimDriver::new(1, memory_bytes));
    let config = Config {
        backend: Backend::Vmm,
        vmm_page_size: page,
        // No headroom: a page of the whole device can then be created.
        vmm_headroom: SizeSpec::Bytes(0),
        ..Config::default()
    };
    let alloc = Allocator::new(sim.clone() as Arc<dyn Driver>, config).unwrap();
    (sim, alloc)
}

/// Was accepted, and then every allocation was out of memory (no page fits the device).
#[test]
fn a_page_larger_than_the_device_is_an_error_naming_the_variable_at_first_use() {
    let (_sim, alloc) = vmm(256 * MIB, SizeSpec::Bytes(512 * MIB));
    for bytes in [4 * MIB, 512] {
        match alloc.malloc(bytes, 0, Stream(1)) {
            Err(e @ Error::Config { var, .. }) => {
                assert_eq!(var, "STREAMPOOL_VMM_PAGE_SIZE");
                let m = e.to_string();
                assert!(
                    m.contains("STREAMPOOL_VMM_PAGE_SIZE=\"512MiB\"")
                        && m.contains("pages of 512.00 MiB")
                        && m.contains("the default is 2MiB")
                        && m.contains(
                            "larger than device 0's memory (STREAMPOOL_SIM_MEMORY) of 256.00 MiB"
                        )
                        && m.contains("is not valid: use a size such as 2MiB or 20MiB"),
                    "{m}"
                );
            }
            other => panic!("malloc({bytes}) gave {other:?}"),
        }
    }
    assert_eq!(
        alloc.device(0).unwrap().stats().unwrap().num_ooms,
        0,
        "not out of memory"
    );
    // A page of the device's size is still a page.
    let (_sim, alloc) = vmm(256 * MIB, SizeSpec::Bytes(256 * MIB));
    let p = alloc.malloc(4 * MIB, 0, Stream(1)).unwrap();
    alloc.free(p, 0).unwrap();
    alloc.empty_cache().unwrap();
}

/// A simulated device of 16777215 TiB: twice its memory overflowed 64 bits, and every malloc
/// failed with `cuMemAddressReserve ... OUT_OF_MEMORY`.
#[test]
fn a_device_too_large_for_the_address_reservation_is_an_error_naming_the_variable() {
    let (_sim, alloc) = vmm(16_777_215 << 40, SizeSpec::Bytes(2 * MIB));
    match alloc.malloc(4 * MIB, 0, Stream(1)) {
        Err(e @ Error::Config { var, .. }) => {
            assert_eq!(var, "STREAMPOOL_SIM_MEMORY");
            let m = e.to_string();
            assert!(
                m.contains("reserves 2 times device 0's memory")
                    && m.contains("more than 64 bits can address")
                    && m.contains("below 8192PiB"),
                "{m}"
            );
        }
        other => panic!("gave {other:?}"),
    }
    // Just below the bound: reserved, and served.
    let (_sim, alloc) = vmm(4096 << 50, SizeSpec::Bytes(2 * MIB));
    let p = alloc.malloc(4 * MIB, 0, Stream(1)).unwrap();
    alloc.free(p, 0).unwrap();
    alloc.empty_cache().unwrap();
}
