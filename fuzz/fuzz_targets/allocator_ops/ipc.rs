//! Sharing in the allocator_ops harness: a block exported through its pool round-trips through
//! import, close and release as another process would; any other block is refused, changing
//! nothing.

use super::{DevicePtr, Harness, Stream};
use crate::outcome::{Expect, Outcome};

impl Harness {
    /// Exports the block; a shareable one must export (unless an injected fault fired) and then
    /// round-trips through import and close with faults set aside, as another process would.
    pub(super) fn export_import(&mut self, d: usize, p: DevicePtr, stream: Stream) -> Outcome {
        let shareable = self.live[&(d, p)].shareable;
        let exported = (self.alloc.device(d as i64)).and_then(|dev| dev.export(p, stream));
        if !shareable {
            return Outcome::Rejected(
                exported.map(drop),
                Expect::Invalid("not in a shareable pool"),
            );
        }
        let handle = match exported {
            Ok(h) => h,
            Err(e) => return Outcome::MustSucceed(Err(e)),
        };
        let left = self.drain_faults();
        let token = self
            .alloc
            .ipc_import_pool(d as i64, handle.pool_fd)
            .expect("import the pool");
        let imported = self
            .alloc
            .ipc_import(token, &handle, stream)
            .expect("import the block");
        assert_eq!(
            imported, p,
            "the simulator maps an import at the exporter's address"
        );
        self.alloc
            .ipc_close(imported, stream)
            .expect("close the import");
        assert_eq!(self.alloc.ipc_open_imports(), 0);
        (self.alloc.device(d as i64))
            .and_then(|dev| dev.release_export(handle.event))
            .expect("release the export");
        self.reinject(left);
        Outcome::MustSucceed(Ok(()))
    }
}
