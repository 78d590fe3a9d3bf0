//! Presenting a run: the console block laid out like `vllm bench serve`'s
//! and the `--result-json` object with its keys.

pub mod console;
pub mod result_json;
pub mod upgrade;
