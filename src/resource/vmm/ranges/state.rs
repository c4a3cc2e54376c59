//! The state of a free range and the rules by which neighbours merge (the states are listed in
//! [`super`]'s notes).
//!
//! Invariant: two neighbours are one range only in states that [`State::merges_with`] joins;
//! memory freed on a stream takes ready neighbours in ([`State::absorbs`]), ready memory never
//! takes in memory that still waits for a fence.

use crate::driver::Stream;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum State {
    /// (The default: a table's empty slot holds it, meaning nothing.)
    #[default]
    Unmapped,
    Blocked,
    Ready,
    Freed {
        stream: Stream,
        seq: u64,
    },
    Retiring,
}

impl State {
    pub(in crate::resource::vmm) fn usable_by(self, stream: Stream) -> bool {
        match self {
            State::Ready => true,
            State::Freed { stream: s, .. } => s == stream,
            State::Unmapped | State::Blocked | State::Retiring => false,
        }
    }

    /// Mapped memory that some stream may be handed (ready, or freed on one).
    pub(super) fn is_mapped_free(self) -> bool {
        matches!(self, State::Ready | State::Freed { .. })
    }

    /// What a block made of pieces in these two states is: ready only if both are, else freed
    /// on the one stream (with the later fence). `None` for pieces no one stream may use alone.
    pub(in crate::resource::vmm) fn joined(self, other: State) -> Option<State> {
        match (self, other) {
            (State::Ready, s) | (s, State::Ready) => Some(s),
            (a @ State::Freed { .. }, b @ State::Freed { .. }) => a.merges_with(b),
            _ => None,
        }
    }

    /// A range given back in this state next to a neighbour in `other`: the state of the two as
    /// one range, if they may be one. Memory freed on a stream takes ready neighbours in (its
    /// stream sees one block where it freed several, as in stream order, which best fit needs
    /// to choose well; other streams wait for its fence a little longer); ready memory given
    /// back (a fence completed) stays apart from a neighbour that still waits for one.
    pub(super) fn absorbs(self, other: State) -> Option<State> {
        match (self, other) {
            (freed @ State::Freed { .. }, State::Ready) => Some(freed),
            _ => self.merges_with(other),
        }
    }

    /// Two neighbours in these states may be one range.
    pub(super) fn merges_with(self, other: State) -> Option<State> {
        match (self, other) {
            (State::Unmapped, State::Unmapped) => Some(State::Unmapped),
            (State::Blocked, State::Blocked) => Some(State::Blocked),
            (State::Ready, State::Ready) => Some(State::Ready),
            (State::Freed { stream: a, seq: x }, State::Freed { stream: b, seq: y }) if a == b => {
                Some(State::Freed {
                    stream: a,
                    seq: x.max(y),
                })
            }
            _ => None,
        }
    }
}
