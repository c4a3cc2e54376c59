//! The driver cost model of a replay: what each counted driver call would take on a GPU, and the
//! modeled driver time of a replay's calls (the replay gate's `driver_ms`).
//!
//! Invariant: a call not listed costs nothing; `--cost CALL=US` sets the figure of a call.

use std::collections::BTreeMap;

/// Modeled cost of each call on an H100 (driver 580), microseconds; `cuMemSetAccess handles`
/// prices each handle a call covers beyond its first. Calls not listed cost 0 (not measured:
/// `cuMemRelease`, `cuStreamWaitEvent`, `cuMemGetInfo`; synchronisations depend on the GPU's
/// work).
pub const DEFAULT_COSTS_US: [(&str, f64); 10] = [
    ("cuMemSetAccess", 25.0),
    ("cuMemSetAccess handles", 21.0),
    ("cuMemUnmap", 16.0),
    ("cuMemCreate", 14.0),
    ("cuMemMap", 3.0),
    // cuEventRecord + cuEventQuery measured together: 1.1 us, split evenly.
    ("cuEventRecord", 0.55),
    ("cuEventQuery", 0.55),
    // Not measured: priced as the query of an event, which it replaces where a stream has
    // finished its work.
    ("cuStreamQuery", 0.55),
    // cuMemAllocFromPoolAsync + cuMemFreeAsync measured together: 0.8-1.25 us.
    ("cuMemAllocFromPoolAsync", 0.5),
    ("cuMemFreeAsync", 0.5),
];

/// The driver time the calls would take on the GPU, by the cost model.
pub fn modeled_s(calls: &BTreeMap<String, u64>, costs_us: &BTreeMap<String, f64>) -> f64 {
    let call = |name: &str| calls.get(name).copied().unwrap_or(0);
    let us: f64 = costs_us
        .iter()
        .map(|(name, cost)| {
            let n = match name.as_str() {
                // The first handle of each call is in the call's own price.
                "cuMemSetAccess handles" => {
                    call("cuMemSetAccess handles").saturating_sub(call("cuMemSetAccess"))
                }
                other => call(other),
            };
            n as f64 * cost
        })
        .sum();
    us / 1e6
}
