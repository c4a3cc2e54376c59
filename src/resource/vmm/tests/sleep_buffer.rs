//! A sleep buffer reserved ahead (`Sleep::reserve_host_buffer`) is pinned with the resource's
//! lock free; what it finds when it takes the lock again decides what is kept
//! ([`VmmResource::keep_reserved`]): never a buffer over a sleep's contents, never a smaller one
//! over a larger one, and every buffer not kept goes back to be freed.

use super::*;
use crate::driver::VmmDriver;
use crate::resource::vmm::sleep::HostBytes;
use crate::resource::Sleep;

fn pinned(r: &Rig, bytes: u64) -> HostBytes {
    HostBytes {
        buffer: r.sim.host_alloc(0, bytes).unwrap(),
        bytes,
    }
}

fn free(r: &Rig, unused: Option<HostBytes>) {
    if let Some(unused) = unused {
        r.sim.host_free(0, unused.buffer);
    }
}

#[test]
fn a_buffer_pinned_meanwhile_is_kept_unless_a_larger_one_is_or_the_resource_slept() {
    let r = rig();
    let fresh = pinned(&r, 8 * PAGE);
    let (kept, unused) = r.vmm.keep_reserved(&mut r.vmm.state.lock(), fresh);
    assert_eq!(kept.unwrap(), 8 * PAGE);
    assert!(unused.is_none(), "nothing was kept before");
    // A smaller one pinned meanwhile goes back; the larger stays.
    let (kept, unused) = (r.vmm).keep_reserved(&mut r.vmm.state.lock(), pinned(&r, 4 * PAGE));
    assert_eq!(kept.unwrap(), 8 * PAGE);
    assert_eq!(unused.map(|u| u.bytes), Some(4 * PAGE));
    free(&r, unused);
    // A larger one replaces the kept one, which goes back.
    let (kept, unused) = (r.vmm).keep_reserved(&mut r.vmm.state.lock(), pinned(&r, 16 * PAGE));
    assert_eq!(kept.unwrap(), 16 * PAGE);
    assert_eq!(unused.map(|u| u.bytes), Some(8 * PAGE));
    free(&r, unused);
    assert_eq!(r.vmm.host_buffer_bytes(), 16 * PAGE);
    // Another thread slept meanwhile: its buffer holds the contents, and stays untouched.
    let p = r.alloc(3 * PAGE, S1);
    r.sim.complete_all();
    r.vmm.sleep(1, &[]).unwrap();
    let (kept, unused) = (r.vmm).keep_reserved(&mut r.vmm.state.lock(), pinned(&r, 32 * PAGE));
    assert!(kept.unwrap_err().to_string().contains("asleep"));
    assert_eq!(unused.map(|u| u.bytes), Some(32 * PAGE));
    free(&r, unused);
    assert_eq!(r.vmm.host_buffer_bytes(), 16 * PAGE);
    r.vmm.wake().unwrap();
    r.free(p, 3 * PAGE, S1);
    assert_eq!(r.vmm.release_host_buffer().unwrap(), 16 * PAGE);
}
