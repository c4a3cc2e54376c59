//! Which streams' work uses each mapping ([`crate::driver::sim::SimDriver::touch`]): work may touch only memory
//! mapped with access for its device, and never the physical memory another stream's unfinished
//! work uses at another address.
//!
//! Invariant: a mapping's `uses` holds the latest (stream, sequence number) of every stream that
//! touched it; a use counts until the stream's work up to that number has completed.

use super::{Check, SimVmm};
use crate::driver::{DevicePtr, Stream};

impl SimVmm {
    /// Work of `used.0` (device `from`) on `[ptr, ptr + bytes)` of `device`'s memory: the
    /// mappings record it, after the access and alias checks.
    pub(in crate::driver::sim) fn touch(
        &mut self,
        ptr: DevicePtr,
        bytes: u64,
        from: usize,
        device: usize,
        used: (Stream, u64),
        completed: impl Fn((Stream, u64)) -> bool,
    ) -> Check {
        let end = ptr.0.checked_add(bytes).ok_or("range overflows")?;
        self.check_aliases(ptr.0, end, used.0, &completed)?;
        for m in self.covering(ptr.0, end)? {
            if !m.access.contains(&from) {
                return Err(format!(
                    "device {from} touched device {device}'s mapping without access \
                     (cuMemSetAccess)"
                ));
            }
            match m.uses.iter_mut().find(|(s, _)| *s == used.0) {
                Some(u) => u.1 = used.1,
                None => m.uses.push(used),
            }
        }
        Ok(())
    }

    /// Work of `stream` on `[start, end)` may not run beside unfinished work of another stream on
    /// the same physical memory mapped elsewhere (a handle mapped at two addresses).
    fn check_aliases(
        &self,
        start: u64,
        end: u64,
        stream: Stream,
        completed: &impl Fn((Stream, u64)) -> bool,
    ) -> Check {
        let first = self
            .mappings
            .range(..=start)
            .next_back()
            .map_or(start, |(&at, _)| at);
        for (&at, m) in self.mappings.range(first..end) {
            if at + m.bytes <= start {
                continue;
            }
            let root = self.handles.get(&m.handle).map_or(m.handle, |h| h.root);
            let aliases = self
                .handles
                .get(&root)
                .map_or(&[][..], |h| &h.group_mapped_at);
            for &other in aliases.iter().filter(|&&a| a != at) {
                let busy = self.mappings[&other]
                    .uses
                    .iter()
                    .find(|&&(s, seq)| s != stream && !completed((s, seq)));
                if let Some(&(s, tick)) = busy {
                    return Err(format!(
                        "{at:#x} shares its physical memory with {other:#x}, which unfinished work on \
                         stream {s:#x} (tick {tick}) still uses; touched by {stream:#x}"
                    ));
                }
            }
        }
        Ok(())
    }
}
