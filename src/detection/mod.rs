//! The detection benchmark: recorded traces of unchanged servers,
//! resampled in blocks, with changes injected; this product's verdicts and
//! the field's regression rules run over the very same series; detection
//! within 3 and 10 evaluations, delays and false alarms per 10,000
//! evaluations. `cargo bench --bench detection` writes the table.

pub mod bars;
pub mod cell;
pub mod harness;
pub mod rules;
pub mod score;
pub mod table;
pub mod trace;
