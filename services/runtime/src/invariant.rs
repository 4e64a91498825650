//! Invariants checked at the place they must hold. A violation is a bug in
//! this code (or a server that disagrees with it), never bad input: bad
//! input has its own errors and dead letters. [`holds`] stops a debug build
//! (tests, development, the chaos run) at the violation; a release build
//! cannot stop a deployment on it, so it counts the violation
//! (`zopu_invariant_violations_total{invariant}`), logs it, and the caller
//! refuses to go on with what broke it.

use crate::metrics;

/// A partition's consumer received only its own partition's messages
/// (`reaction::lanes`, `Runner::route`).
pub const PARTITION_OWNERSHIP: &str = "reaction.partition_ownership";
/// An event the publisher is about to append extends its project's chain
/// from the head its expectation names (`publish`, before every append).
pub const CHAIN_EXTENSION: &str = "publish.chain_extension";
/// An append expects the last sequence of the event's own project's
/// subjects, and only a project's first event expects none (`publish`).
pub const EXPECTED_SEQUENCE: &str = "publish.expected_sequence";

/// An appended event carries a well-formed `traceparent`: its append
/// span's, or its cause's when nothing is traced there (`publish`).
pub const TRACE_CONTEXT: &str = "publish.trace_context";
/// Every metric family has a name of its own in the process's registry
/// (`metrics::register`).
pub const METRIC_NAME_UNIQUE: &str = "metrics.name_unique";

/// Whether `invariant` held (`held`). A violation panics in a debug build;
/// in a release build it is counted and logged with `detail`, and the
/// caller must not go on as if it held.
pub fn holds(invariant: &'static str, held: bool, detail: impl FnOnce() -> String) -> bool {
    if held {
        return true;
    }
    let detail = detail();
    metrics::invariant_violated(invariant);
    tracing::error!(invariant, %detail, "invariant violated");
    debug_assert!(false, "invariant {invariant} violated: {detail}");
    false
}

#[cfg(test)]
mod tests {
    use super::holds;

    #[test]
    fn an_invariant_that_holds_costs_nothing_and_says_so() {
        assert!(holds("test.holds", true, || unreachable!(
            "no detail is built"
        )));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "invariant test.broken violated: what broke")]
    fn a_violation_stops_a_debug_build() {
        holds("test.broken", false, || "what broke".to_owned());
    }
}
