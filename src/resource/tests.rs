//! The table of backends: one row each, and what each row says of its resources.

use super::BACKENDS;
use crate::config::Backend;

#[test]
fn every_backend_has_one_row() {
    for backend in Backend::ALL {
        let rows = BACKENDS.iter().filter(|row| row.backend == backend).count();
        assert_eq!(rows, 1, "{backend:?}");
    }
    assert_eq!(BACKENDS.len(), Backend::ALL.len());
}

/// The sources `backend` provisions on a simulated device of 16 GiB, with the default settings.
#[cfg(feature = "sim")]
fn provisioned(backend: Backend) -> super::Provision {
    use crate::config::Settings;
    use crate::driver::{sim::SimDriver, Driver};
    use crate::history::{History, Recorder};
    use std::sync::{atomic::AtomicU64, Arc};
    const MEMORY_BYTES: u64 = 16 << 30;
    let driver: Arc<dyn Driver> = Arc::new(SimDriver::new(1, MEMORY_BYTES));
    let mut settings = Settings::default().for_device(MEMORY_BYTES).sources;
    settings.backend = backend;
    let limit = Arc::new(AtomicU64::new(u64::MAX));
    let recorder = Arc::new(Recorder::new(0, Arc::new(History::default())));
    let made = super::provision(&driver, 0, &settings, MEMORY_BYTES, &limit, &recorder);
    made.expect("provisioned")
}

/// A row says its backend sleeps exactly when the resources it makes can.
#[cfg(feature = "sim")]
#[test]
fn every_row_says_whether_its_resources_can_sleep() {
    for row in BACKENDS {
        let made = provisioned(row.backend);
        assert_eq!(made.backend, row.backend, "{:?} fell back", row.backend);
        for resource in made.sources.own() {
            let sleeps = resource.capabilities().sleep.is_some();
            assert_eq!(
                sleeps,
                row.sleeps,
                "{:?}: {}",
                row.backend,
                resource.traits().label
            );
        }
    }
}

/// The vmm backend's one resource is the device's fast own source, for every size, called by its
/// own type; the other backends have none (their blocks are served through the cache).
#[cfg(feature = "sim")]
#[test]
fn the_vmm_backend_alone_provisions_a_fast_own_source_for_every_size() {
    use crate::resource::Resource;
    use std::sync::Arc;
    for row in BACKENDS {
        let sources = provisioned(row.backend).sources;
        let Some(fast) = sources.fast_own() else {
            assert_ne!(
                row.backend,
                Backend::Vmm,
                "the vmm backend has no fast own source"
            );
            continue;
        };
        assert_eq!(row.backend, Backend::Vmm, "{:?}", row.backend);
        assert_eq!(fast.id, sources.for_size(512));
        assert_eq!(fast.id, sources.for_size(u64::MAX));
        let own = sources.own();
        assert_eq!(own.len(), 1);
        let same = std::ptr::addr_eq(Arc::as_ptr(&own[0]), Arc::as_ptr(&fast.resource));
        assert!(same, "the fast own source is the own resource");
        // The device's fast path skips the cache and calls the resource under its own lock.
        let traits = fast.resource.traits();
        assert!(traits.fast_path && !traits.cacheable, "{}", traits.label);
        assert!(fast.held && traits.held);
    }
}
