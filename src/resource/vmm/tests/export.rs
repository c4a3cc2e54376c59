//! An export's descriptors are made with the resource's lock free; the block is marked exported
//! under the lock once the export went through ([`PageExport::mark_exported`]). A sleep between
//! the two gives the pages back, so the mark is refused: no importer gets memory that the wake
//! will not map again.

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
    let e = r.vmm.mark_exported(p, 3 * PAGE).unwrap_err().to_string();
    assert!(e.contains("asleep") && e.contains("sharing"), "{e}");
    close(&pages.fds);
    r.vmm.wake().unwrap();
    // Not marked: it sleeps again; marked, it refuses to.
    r.vmm.sleep(2, &[]).unwrap();
    r.vmm.wake().unwrap();
    r.vmm.mark_exported(p, 3 * PAGE).unwrap();
    let e = r.vmm.sleep(1, &[]).unwrap_err().to_string();
    assert!(e.contains("shared with other processes"), "{e}");
    // A block no longer live is not marked.
    r.free(p, 3 * PAGE, S1);
    assert!(r.vmm.mark_exported(p, 3 * PAGE).is_err());
    r.sim.complete_all();
    r.vmm.sleep(1, &[]).unwrap();
    r.vmm.wake().unwrap();
}
