//! The books of the simulated virtual memory: handles (created or imported, counted as device
//! memory once per created handle), their release, and the mappings that cover a range.
//!
//! Invariant: `created_bytes` is the sum of the created (root) handles' bytes.

use super::*;

impl SimVmm {
    pub(in crate::driver::sim) fn physical_bytes(&self) -> u64 {
        debug_assert_eq!(
            self.created_bytes,
            (self.handles.iter())
                .filter(|(&id, h)| h.root == id)
                .map(|(_, h)| h.bytes)
                .sum::<u64>()
        );
        self.created_bytes
    }

    /// A new handle id of `bytes`: created here (`root` None) or importing `root`'s memory.
    pub(super) fn new_handle(
        &mut self,
        bytes: u64,
        exportable: bool,
        root: Option<usize>,
    ) -> usize {
        let id = self.next_handle;
        self.next_handle += 1;
        if let Some(root) = root {
            if let Some(r) = self.handles.get_mut(&root) {
                r.imports += 1;
            }
        }
        let handle = SimHandle {
            bytes,
            mapped_at: Vec::new(),
            exportable,
            root: root.unwrap_or(id),
            released: false,
            imports: 0,
            group_mapped_at: Vec::new(),
        };
        if root.is_none() {
            self.created_bytes += bytes;
        }
        self.handles.insert(id, handle);
        id
    }

    /// Releases handle `id` (unmapped): an import goes at once; a created handle's memory once
    /// its creator and every import released it.
    pub(super) fn release_handle(&mut self, id: usize) -> Check {
        let root = match self.handles.get(&id) {
            None => return Err(format!("handle {id} is not a live handle")),
            Some(h) if !h.mapped_at.is_empty() => {
                return Err(format!(
                    "handle {id} is still mapped at {:#x}",
                    h.mapped_at[0]
                ))
            }
            Some(h) if h.root == id && h.released => {
                return Err(format!("handle {id} was released already"))
            }
            Some(h) => h.root,
        };
        if root != id {
            self.handles.remove(&id);
            if let Some(r) = self.handles.get_mut(&root) {
                r.imports = r.imports.saturating_sub(1);
            }
        } else if let Some(r) = self.handles.get_mut(&id) {
            r.released = true;
        }
        if self
            .handles
            .get(&root)
            .is_some_and(|r| r.released && r.imports == 0)
        {
            if let Some(gone) = self.handles.remove(&root) {
                self.created_bytes -= gone.bytes;
            }
            self.contents.remove(&root);
        }
        Ok(())
    }

    /// True if `ptr` lies in a reservation.
    pub(in crate::driver::sim) fn contains(&self, ptr: DevicePtr) -> bool {
        self.reservation_of(ptr.0).is_some()
    }

    pub(super) fn reservation_of(&self, addr: u64) -> Option<(u64, u64)> {
        let (&base, r) = self.reservations.range(..=addr).next_back()?;
        (addr < base + r.bytes).then_some((base, r.bytes))
    }

    /// The mappings covering `[start, end)`, which must be covered without a gap.
    pub(super) fn covering(
        &mut self,
        start: u64,
        end: u64,
    ) -> std::result::Result<Vec<&mut Mapping>, String> {
        let first = self
            .mappings
            .range(..=start)
            .next_back()
            .map_or(start, |(&at, _)| at);
        let mut next = start;
        let mut out = Vec::new();
        for (&at, m) in self.mappings.range_mut(first..end) {
            if at + m.bytes <= next {
                continue;
            }
            if at > next {
                break;
            }
            next = at + m.bytes;
            out.push(m);
        }
        match next >= end {
            true => Ok(out),
            false => Err(format!("{next:#x} is not mapped")),
        }
    }

    pub(in crate::driver::sim) fn leaks(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (what, n) in [
            ("address reservations not freed", self.reservations.len()),
            ("physical handles not released", self.handles.len()),
            ("mappings not unmapped", self.mappings.len()),
            ("host buffers not freed", self.host.len()),
        ] {
            if n > 0 {
                out.push(format!("{n} {what}"));
            }
        }
        out
    }
}
