//! A catalogue of benchmark scenarios (single-user latency, short- and
//! long-context throughput, decode stress, mixed traffic, concurrency
//! scaling), shipped as named presets. A scenario
//! names a preset and may scale its lengths (`scale`) to fit a smaller
//! model or a tighter probe budget, then override any field.

/// One preset's workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preset {
    pub name: &'static str,
    pub purpose: &'static str,
    pub input_len: u32,
    pub output_len: u32,
    pub range_ratio: f64,
    /// The concurrency levels; more than one makes one scenario per level.
    pub concurrency: &'static [u32],
    pub num_requests: u32,
}

pub const PRESETS: &[Preset] = &[
    Preset {
        name: "single-user-latency",
        purpose: "best-case latency with no batching",
        input_len: 2048,
        output_len: 512,
        range_ratio: 0.0,
        concurrency: &[1],
        num_requests: 20,
    },
    Preset {
        name: "short-context-throughput",
        purpose: "many short chats at once",
        input_len: 512,
        output_len: 256,
        range_ratio: 0.0,
        concurrency: &[16],
        num_requests: 50,
    },
    Preset {
        name: "long-context",
        purpose: "prefill cost of long prompts",
        input_len: 16384,
        output_len: 1024,
        range_ratio: 0.0,
        concurrency: &[4],
        num_requests: 10,
    },
    Preset {
        name: "decode-stress",
        purpose: "long generation with minimal prefill",
        input_len: 128,
        output_len: 2048,
        range_ratio: 0.0,
        concurrency: &[1],
        num_requests: 5,
    },
    Preset {
        name: "mixed-traffic",
        purpose: "lengths spread +-50% like real users",
        input_len: 2048,
        output_len: 512,
        range_ratio: 0.5,
        concurrency: &[8],
        num_requests: 30,
    },
    Preset {
        name: "concurrency-scaling",
        purpose: "the latency/throughput trade-off across concurrency",
        input_len: 1024,
        output_len: 256,
        range_ratio: 0.0,
        concurrency: &[2, 4, 8, 16, 32],
        num_requests: 30,
    },
];

pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

pub fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.name).collect()
}
