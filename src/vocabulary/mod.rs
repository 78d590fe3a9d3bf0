//! The vocabulary every layer shares: plain data, no I/O. Run and request
//! records and their outcomes, the key of a series of runs, a drift
//! canary's answers, GPU readings, histogram resolutions, label matchers.

pub mod answers;
pub mod gpu;
pub mod histograms;
pub mod matchers;
pub mod outcome;
pub mod pairs;
pub mod records;

pub use outcome::Outcome;
pub use pairs::PairKey;
