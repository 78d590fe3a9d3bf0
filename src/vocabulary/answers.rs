//! A drift canary's greedy answers.

use serde::{Deserialize, Serialize};

/// One prompt's greedy answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    pub prompt: usize,
    pub tokens: Vec<String>,
    pub logprobs: Vec<f64>,
}
