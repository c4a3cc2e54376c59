//! Replacing virtual methods of one C++ object: its vtable is copied, chosen slots of the copy
//! are overwritten, and the object is pointed at the copy (other objects of the class keep the
//! original).
//!
//! Invariants: a slot is replaced only if it was found holding exactly the function expected
//! there — an exported method by its mangled name, or a method PyTorch does not export by its
//! place between two exported ones whose distance is checked — and the object is repointed only
//! if its vtable is the class's; copies are leaked (the object may live until process exit).

use super::lookup;
use std::ffi::{c_void, CStr};

/// Where a slot is.
pub(crate) enum SlotAt {
    /// The slot holding this exported function.
    Symbol(&'static CStr),
    /// `offset` slots after the slot holding `anchor`, where the slot holding `closing` must be
    /// exactly `span` slots after `anchor` (a virtual added or removed between them is seen).
    Between {
        anchor: &'static CStr,
        offset: usize,
        closing: &'static CStr,
        span: usize,
    },
}

/// A slot to replace and what goes there.
pub(crate) struct Replacement {
    /// The feature it serves, for messages ("cuDNN benchmark mode (cacheInfo)").
    pub feature: &'static str,
    pub at: SlotAt,
    pub function: *const c_void,
}

/// The class whose objects are patched.
pub(crate) struct Class {
    /// Mangled name of its vtable (`_ZTV...`).
    pub vtable: &'static CStr,
    /// Mangled name of its type (what its type_info's name says, `N...E`).
    pub type_name: &'static CStr,
    /// Libraries to look in, by soname.
    pub libraries: &'static [&'static CStr],
}

/// What [`patch`] did.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub replaced: Vec<&'static str>,
    /// Features whose slot was not found, with why.
    pub missing: Vec<(&'static str, String)>,
}

/// The class's vtable as words (offset-to-top, type_info, then the slots), checked to be the
/// class's primary vtable.
fn class_vtable(class: &Class) -> Result<&'static [usize], String> {
    let name = class.vtable.to_string_lossy();
    let start = lookup::symbol(class.libraries, class.vtable)
        .ok_or_else(|| format!("{name} is not in the loaded libraries"))?;
    let bytes =
        lookup::symbol_size(start).ok_or_else(|| format!("the size of {name} is unknown"))?;
    let words = bytes / std::mem::size_of::<usize>();
    if words < 3 {
        return Err(format!("{name} is too small ({bytes} bytes)"));
    }
    // SAFETY: the symbol spans `bytes` of readable, word-aligned data (a vtable).
    let table = unsafe { std::slice::from_raw_parts(start as *const usize, words) };
    // SAFETY: word 1 of a primary vtable is the class's type_info: {vptr, name, ...}.
    let type_name = unsafe { CStr::from_ptr(*(table[1] as *const *const std::ffi::c_char).add(1)) };
    if table[0] != 0 || type_name != class.type_name {
        return Err(format!(
            "{name} is not the primary vtable of {:?}",
            class.type_name
        ));
    }
    Ok(table)
}

/// The index in `table` of the one slot holding exported function `symbol`.
fn slot_of(class: &Class, table: &[usize], symbol: &CStr) -> Result<usize, String> {
    let name = symbol.to_string_lossy();
    let function = lookup::symbol(class.libraries, symbol)
        .ok_or_else(|| format!("{name} is not in the loaded libraries"))?
        as usize;
    let mut found = (2..table.len()).filter(|&i| table[i] == function);
    match (found.next(), found.next()) {
        (Some(i), None) => Ok(i),
        (None, _) => Err(format!("no slot holds {name}")),
        (Some(_), Some(_)) => Err(format!("more than one slot holds {name}")),
    }
}

fn locate(class: &Class, table: &[usize], at: &SlotAt) -> Result<usize, String> {
    match *at {
        SlotAt::Symbol(symbol) => slot_of(class, table, symbol),
        SlotAt::Between {
            anchor,
            offset,
            closing,
            span,
        } => {
            let first = slot_of(class, table, anchor)?;
            let last = slot_of(class, table, closing)?;
            if last.checked_sub(first) != Some(span) || offset == 0 || offset >= span {
                return Err(format!(
                    "the slots between {} and {} are not the expected {}",
                    anchor.to_string_lossy(),
                    closing.to_string_lossy(),
                    span.saturating_sub(1)
                ));
            }
            Ok(first + offset)
        }
    }
}

/// True if slot `index` (from the address point) of the class's vtable holds exported
/// function `symbol`.
pub(crate) fn slot_holds(class: &Class, index: usize, symbol: &CStr) -> bool {
    let Ok(table) = class_vtable(class) else {
        return false;
    };
    let function = lookup::symbol(class.libraries, symbol).map(|f| f as usize);
    function.is_some() && table.get(index + 2).copied() == function
}

/// Points `object` (an instance of `class`, whose vtable pointer is its first word) at a copy
/// of the class's vtable with `replacements` in place. Slots that cannot be located are left
/// alone and reported; if none can, the object is left untouched.
///
/// # Safety
/// `object` must be a live instance of `class` that no other thread calls through its vtable
/// while this runs, and it must be used only while the process's loaded libraries stay loaded.
/// Each replacement function must have the C ABI signature of the C++ method it replaces
/// (`this` first; a hidden return pointer before it where the method returns a class by value).
pub(crate) unsafe fn patch(
    object: *mut c_void,
    class: &Class,
    replacements: &[Replacement],
) -> Result<Outcome, String> {
    let table = class_vtable(class)?;
    let address_point = table.as_ptr().wrapping_add(2) as usize;
    // SAFETY: the caller promises a live object whose first word is its vtable pointer.
    let current = unsafe { *(object as *const usize) };
    if current != address_point {
        return Err(format!(
            "the object's vtable is not {}'s (already replaced, or another class)",
            class.type_name.to_string_lossy()
        ));
    }
    let mut copy = table.to_vec().into_boxed_slice();
    let mut outcome = Outcome::default();
    for r in replacements {
        match locate(class, table, &r.at) {
            Ok(i) => {
                copy[i] = r.function as usize;
                outcome.replaced.push(r.feature);
            }
            Err(why) => outcome.missing.push((r.feature, why)),
        }
    }
    if !outcome.replaced.is_empty() {
        let copy: &'static mut [usize] = Box::leak(copy);
        // SAFETY: as the caller promises, nothing calls through the object concurrently; the
        // new vtable is the class's with checked slots replaced, and is never freed.
        unsafe { *(object as *mut usize) = copy.as_ptr().wrapping_add(2) as usize };
    }
    Ok(outcome)
}
