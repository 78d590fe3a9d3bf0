//! What a series of runs is kept and judged by.

/// The key of one series of runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct PairKey {
    pub target: String,
    pub model: String,
    pub scenario: String,
}
