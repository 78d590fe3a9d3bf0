//! The documented range of every number a probe takes, shared by the
//! command line ([`crate::probe::ProbeSpec::validate`]) and the
//! configuration file, so that a value one accepts the other accepts too,
//! and no accepted value can overflow a clock or exhaust memory.

use std::time::Duration;

/// Requests per run (measured).
pub const MAX_REQUESTS: u64 = 1_000_000;
/// Warm-up requests per run.
pub const MAX_WARMUP: u64 = 10_000;
/// Requests in flight at once.
pub const MAX_CONCURRENCY: u64 = 100_000;
/// Most turns in one conversation of a multi-turn scenario.
pub const MAX_TURNS: u32 = 64;
/// Tokens of one prompt or one output.
pub const MAX_LEN: u64 = 1 << 20;
/// Tokens of every prompt and output of one run together, warm-up
/// included, at the longest lengths the range ratio can draw: prompts are
/// built before a run starts and each output chunk's time is kept, so this
/// bounds a run's memory (about 100 MB of prompt text at most).
pub const MAX_RUN_TOKENS: u64 = 1 << 24;
/// Open-loop request rate, requests per second.
pub const MIN_REQUEST_RATE: f64 = 0.001;
pub const MAX_REQUEST_RATE: f64 = 1_000_000.0;
/// Gamma shape of the open-loop gaps.
pub const MIN_BURSTINESS: f64 = 0.01;
pub const MAX_BURSTINESS: f64 = 100.0;
/// Connect timeout.
pub const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(600);
/// First-token, stall and whole-request timeouts, and a run's deadline.
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(86_400);
/// Any other duration in the configuration (retention, back-off, ...).
pub const MAX_DURATION: Duration = Duration::from_secs(3650 * 86_400);

/// The longest length the range ratio can draw for `len`, as
/// [`crate::workload::prompts::sample_lengths`] draws it.
pub fn longest(len: u32, range_ratio: f64) -> u64 {
    (f64::from(len) * (1.0 + range_ratio)).ceil() as u64
}

/// Checks a run's token budget; the message names the fix.
pub fn check_run_tokens(
    input_len: u32,
    output_len: u32,
    range_ratio: f64,
    requests: u64,
    warmup: u64,
) -> Result<(), String> {
    let per_request = longest(input_len, range_ratio) + longest(output_len, range_ratio);
    let total = per_request.saturating_mul(requests + warmup);
    if total > MAX_RUN_TOKENS {
        return Err(format!(
            "{requests} requests and {warmup} warm-up requests of up to {per_request} tokens each are \
{total} tokens, more than the {MAX_RUN_TOKENS} one run may hold; send fewer or shorter requests"
        ));
    }
    Ok(())
}

/// Checks that one request fits the model's context.
pub fn check_context(
    input_len: u32,
    output_len: u32,
    range_ratio: f64,
    max_model_len: u64,
) -> Result<(), String> {
    let (input, output) = (
        longest(input_len, range_ratio),
        longest(output_len, range_ratio),
    );
    if input + output > max_model_len {
        return Err(format!(
            "requests of up to {input} input and {output} output tokens exceed the model's \
max_model_len of {max_model_len} (from /v1/models)"
        ));
    }
    Ok(())
}

/// A duration within `(0, max]`, as the command line gives it in seconds.
pub fn seconds(flag: &str, value: f64, max: Duration) -> Result<Duration, String> {
    if !value.is_finite() || value <= 0.0 {
        return Err(format!(
            "{flag}: {value:?} must be a positive number of seconds"
        ));
    }
    if value > max.as_secs_f64() {
        return Err(format!(
            "{flag}: {value:?} is more than the {} seconds allowed",
            max.as_secs()
        ));
    }
    Ok(Duration::from_secs_f64(value))
}

/// The most of a telemetry page (`/metrics`, a DCGM exporter) read: a
/// real vLLM page is about 100 KiB, an 8-GPU DCGM page less; a larger one
/// is refused rather than held in memory.
pub const MAX_TELEMETRY_PAGE: usize = 8 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_budget_refuses_what_would_exhaust_memory() {
        assert!(check_run_tokens(128, 64, 0.0, 64, 0).is_ok());
        let err = check_run_tokens(4_194_304, 64, 0.0, 200, 0).unwrap_err();
        assert!(err.contains("more than the 16777216"), "{err}");
        assert!(check_run_tokens(1 << 20, 1 << 20, 0.99, 1_000_000, 10_000).is_err());
    }

    #[test]
    fn context_and_seconds_are_checked() {
        assert!(check_context(100, 28, 0.0, 128).is_ok());
        let err = check_context(100, 29, 0.0, 128).unwrap_err();
        assert!(err.contains("max_model_len of 128"), "{err}");
        assert!(seconds("--x", 1e19, MAX_REQUEST_TIMEOUT).is_err());
        assert!(seconds("--x", f64::INFINITY, MAX_REQUEST_TIMEOUT).is_err());
        assert!(seconds("--x", 0.0, MAX_REQUEST_TIMEOUT).is_err());
        assert_eq!(
            seconds("--x", 1.5, MAX_REQUEST_TIMEOUT).unwrap(),
            Duration::from_millis(1500)
        );
    }
}
