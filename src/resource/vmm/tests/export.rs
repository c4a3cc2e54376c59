//! An export's descriptors are made with the resource's lock free; the export is counted under
//! the lock once it went through ([`PageExport::mark_exported`]). A sleep between the two (even
//! with its wake) gives the pages back, so the mark is refused: no importer gets memory that the
//! block no longer lies on.

use super::*;
use crate::resource::{PageExport, Sleep};

fn close(fds: &[i32]) {
    for &fd in fds.iter().filter(|&&fd| fd >= 0) {
        // SAFETY: descriptors the export handed to this test, closed once.
        unsafe { libc::close(fd) };
    }
}

#[test]
fn an_export_the_resource_slept_across_is_refused_at_its_mark() {
    let r = rig();
    let p = r.alloc(3 * PAGE, S1);
    let pages = r.vmm.export_pages(p, 3 * PAGE).unwrap();
    r.sim.complete_all();
    r.vmm.sleep(1, &[]).unwrap(); // another thread's, before the export is marked
    let e = r
        .vmm
        .mark_exported(p, 3 * PAGE, &pages)
        .unwrap_err()
        .to_string();
    assert!(e.contains("asleep") && e.contains("sharing"), "{e}");
    close(&pages.fds);
    r.vmm.wake().unwrap();
    // Pages read before a sleep and a wake are not the block's any more: not marked either.
    let e = r.vmm.mark_exported(p, 3 * PAGE, &pages).unwrap_err();
    assert!(
        e.to_string().contains("slept while it was being shared"),
        "{e}"
    );
    // Not marked: it sleeps again; an export marked, it refuses to until released.
    r.vmm.sleep(2, &[]).unwrap();
    r.vmm.wake().unwrap();
    let pages = r.vmm.export_pages(p, 3 * PAGE).unwrap();
    close(&pages.fds);
    let mark = r.vmm.mark_exported(p, 3 * PAGE, &pages).unwrap();
    let e = r.vmm.sleep(1, &[]).unwrap_err().to_string();
    assert!(e.contains("shared with other processes"), "{e}");
    r.vmm.unmark_exported(p, mark);
    r.vmm.sleep(1, &[]).unwrap();
    r.vmm.wake().unwrap();
    // A block no longer live is not marked.
    r.free(p, 3 * PAGE, S1);
    assert!(r.vmm.mark_exported(p, 3 * PAGE, &pages).is_err());
    r.sim.complete_all();
    r.vmm.sleep(1, &[]).unwrap();
    r.vmm.wake().unwrap();
}

/// Another thread may free the block between its export's pages and its mark, and a block of the
/// same size land at its address: the mark read with the pages names the freed block, so the
/// export is refused, and the new block is not counted as shared.
#[test]
fn an_export_whose_block_was_freed_before_its_mark_is_refused() {
    let r = rig();
    let p = r.alloc(3 * PAGE, S1);
    let pages = r.vmm.export_pages(p, 3 * PAGE).unwrap();
    close(&pages.fds);
    r.free(p, 3 * PAGE, S1);
    let q = r.alloc(3 * PAGE, S1);
    assert_eq!(q, p, "at the same address");
    let e = r.vmm.mark_exported(p, 3 * PAGE, &pages).unwrap_err();
    assert!(e.to_string().contains("was freed while"), "{e}");
    r.sim.complete_all();
    r.vmm.sleep(1, &[]).unwrap(); // not counted: q sleeps
    r.vmm.wake().unwrap();
    // q's own export marks q.
    let pages = r.vmm.export_pages(q, 3 * PAGE).unwrap();
    close(&pages.fds);
    let mark = r.vmm.mark_exported(q, 3 * PAGE, &pages).unwrap();
    assert!(r.vmm.sleep(1, &[]).is_err());
    r.vmm.unmark_exported(q, mark);
    r.free(q, 3 * PAGE, S1);
}
