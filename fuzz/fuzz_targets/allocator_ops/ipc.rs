//! Sharing in the allocator_ops harness: a block exported through its pool round-trips through
//! import, close and release as another process would; any other block is refused, changing
//! nothing. A block exported page by page (the vmm backend) keeps its export until released: the
//! model holds the export with the block's identity, and the device may not sleep while an export
//! of a block still live (that allocation, not a later one at its address) is held.

use super::{DevicePtr, Harness, Stream};
use crate::outcome::{Expect, Outcome};
use std::os::fd::{FromRawFd, OwnedFd};
use streampool::ipc::IpcKind;

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

    /// Exports the block's pages and holds the export: a block of a source whose pages export
    /// must export on an awake device (unless an injected fault fired); any other is refused.
    pub(super) fn export_pages(&mut self, d: usize, p: DevicePtr, stream: Stream) -> Outcome {
        let dev = self.alloc.device(d as i64).expect("a valid device");
        let kind = dev.ipc_kind(p).expect("a live block has a kind");
        let exported = dev.export_pages(p, stream);
        if kind != IpcKind::Pages {
            let refused = Expect::Invalid("whose pages can be shared");
            return Outcome::Rejected(exported.map(drop), refused);
        }
        if self.asleep[d] {
            return Outcome::Rejected(exported.map(drop), Expect::Invalid("is asleep"));
        }
        let (handle, fds) = match exported {
            Ok(exported) => exported,
            Err(e) => return Outcome::MustSucceed(Err(e)),
        };
        for fd in fds.into_iter().filter(|&fd| fd >= 0) {
            // SAFETY: a descriptor the export handed to the harness, owned (and closed) once.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let id = self.live[&(d, p)].id;
        self.page_exports.push((d, p, id, handle.event));
        Outcome::MustSucceed(Ok(()))
    }

    /// Releases a held export of pages, as once every importer closed it.
    pub(super) fn release_page_export(&mut self, pick: u8) -> Outcome {
        if self.page_exports.is_empty() {
            return Outcome::None;
        }
        let (d, _, _, event) = self
            .page_exports
            .remove(usize::from(pick) % self.page_exports.len());
        let released = (self.alloc.device(d as i64)).and_then(|dev| dev.release_export(event));
        Outcome::MustSucceed(released)
    }

    /// True if an export of a block of `d` still live, the allocation it was made of, is held.
    pub(super) fn shares_live_pages(&self, d: usize) -> bool {
        self.page_exports
            .iter()
            .any(|&(ed, p, id, _)| ed == d && self.live.get(&(d, p)).is_some_and(|b| b.id == id))
    }
}
