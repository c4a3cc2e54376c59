//! The streams of a device seen capturing a CUDA graph. During a capture no event may be queried
//! or recorded on the device in the default capture mode, and nothing may be mapped or
//! synchronised: an owner that knows of a capture does none of that until the capture has ended.
//!
//! Invariants: a stream is added when its owner sees it capture and leaves only once the driver
//! says it no longer does (asking whether a stream captures is allowed during a capture); a
//! stream the driver cannot answer for (destroyed) is not capturing — a capture ends before its
//! stream can be destroyed.

use crate::driver::{Driver, Stream};

#[derive(Debug, Default)]
pub(crate) struct CaptureWatch {
    streams: Vec<Stream>,
}

impl CaptureWatch {
    /// Notes that `stream` is capturing; true if it was not known to be.
    pub fn note(&mut self, stream: Stream) -> bool {
        let new = !self.streams.contains(&stream);
        if new {
            self.streams.push(stream);
        }
        new
    }

    /// True while a capture is known, without asking the driver whether it has ended.
    #[inline]
    pub fn any_known(&self) -> bool {
        !self.streams.is_empty()
    }

    /// Forgets the captures that have ended; true while one is still under way. Asks the driver
    /// only while a capture is known.
    pub fn refresh(&mut self, driver: &dyn Driver, device: usize) -> bool {
        if !self.streams.is_empty() {
            self.streams
                .retain(|s| driver.is_capturing(device, *s).unwrap_or(false));
        }
        !self.streams.is_empty()
    }
}
