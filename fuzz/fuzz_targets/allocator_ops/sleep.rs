//! Sleep and wake in the allocator_ops harness: the model knows which devices sleep; a refused
//! sleep or wake changes nothing, a device asleep refuses allocations (saying so) and takes
//! frees, and after a wake every live block of the device can be used again on its stream.
//! Sleep and wake are not tried while a stream of the device captures (the allocator knows of a
//! capture only from what it saw on the stream, so the model could not say which error comes).

use super::{device_ok, Harness};
use crate::outcome::{Expect, Outcome};

impl Harness {
    pub(super) fn sleep(&mut self, device: i64, level: u8) -> Outcome {
        let Some(d) = device_ok(device) else {
            let r = self.alloc.device(device).and_then(|dev| dev.sleep(1, &[]));
            return Outcome::Rejected(r.map(drop), Expect::BadDevice(device));
        };
        if self.capturing.iter().any(|&(cd, _)| cd == d) {
            return Outcome::None;
        }
        let level = u32::from(level % 4);
        let r = self
            .alloc
            .device(device)
            .and_then(|dev| dev.sleep(level, &[]));
        let expect = match () {
            _ if !matches!(level, 1 | 2) => Some(Expect::Invalid("sleep level")),
            _ if !self.vmm => Some(Expect::Invalid("needs the vmm backend")),
            _ if self.asleep[d] => Some(Expect::Invalid("asleep already")),
            _ if self.shares_live_pages(d) => Some(Expect::Invalid("shared with other processes")),
            _ => None,
        };
        self.asleep[d] = self.is_asleep(d);
        match expect {
            Some(expect) => Outcome::Rejected(r.map(drop), expect),
            None => {
                // Asleep unless a fault stopped it before its first page went back.
                assert!(r.is_err() || self.asleep[d], "slept, yet awake");
                Outcome::MustSucceed(r.map(drop))
            }
        }
    }

    pub(super) fn wake(&mut self, device: i64) -> Outcome {
        let Some(d) = device_ok(device) else {
            let r = self.alloc.device(device).and_then(|dev| dev.wake());
            return Outcome::Rejected(r.map(drop), Expect::BadDevice(device));
        };
        if self.capturing.iter().any(|&(cd, _)| cd == d) {
            return Outcome::None;
        }
        let r = self.alloc.device(device).and_then(|dev| dev.wake());
        let expect = match () {
            _ if !self.vmm => Some(Expect::Invalid("needs the vmm backend")),
            _ if !self.asleep[d] => Some(Expect::Invalid("not asleep")),
            _ => None,
        };
        self.asleep[d] = self.is_asleep(d);
        match expect {
            Some(expect) => Outcome::Rejected(r.map(drop), expect),
            None => {
                if r.is_ok() {
                    assert!(!self.asleep[d], "woke, yet asleep");
                    self.check_awake_blocks(d);
                }
                Outcome::MustSucceed(r.map(drop))
            }
        }
    }

    /// Wakes every sleeping device (no fault pending): the end of a run.
    pub(super) fn wake_all(&mut self) {
        for d in 0..self.asleep.len() {
            if self.asleep[d] {
                (self.alloc.device(d as i64))
                    .and_then(|dev| dev.wake())
                    .unwrap_or_else(|e| panic!("final wake of device {d}: {e}"));
                self.asleep[d] = false;
                self.check_awake_blocks(d);
            }
        }
    }

    fn is_asleep(&self, d: usize) -> bool {
        (self.alloc.device(d as i64)).is_ok_and(|dev| dev.is_asleep())
    }

    /// Every live block of awake device `d` can be used on its stream: mapped with access.
    fn check_awake_blocks(&self, d: usize) {
        for (p, b) in self.live_on(d) {
            if let Err(e) = self.sim.touch(d, d, *p, b.bytes, b.stream) {
                panic!(
                    "device {d}: live block {p:#x}+{} unusable after wake: {e}",
                    b.bytes
                );
            }
        }
    }
}
