//! GPU counters per target, from NVML on this host or a DCGM exporter:
//! each reading replaces the target's series as a whole, so a GPU that
//! disappears loses its series.

use super::MetricsError;
use super::page::{Gauges, Page};

pub use crate::vocabulary::gpu::GpuReading;

impl GpuReading {
    /// The values in the order of [`FAMILIES`].
    fn values(&self) -> [Option<f64>; 10] {
        [
            self.utilization_ratio,
            self.memory_used_bytes,
            self.memory_total_bytes,
            self.power_watts,
            self.temperature_celsius,
            self.sm_clock_hertz,
            self.graphics_engine_active_ratio,
            self.tensor_active_ratio,
            self.dram_active_ratio,
            self.last_xid,
        ]
    }
}

/// Name and help of each family, in the order of [`GpuReading::values`].
const FAMILIES: [(&str, &str); 10] = [
    ("sentinel_gpu_utilization_ratio", "GPU utilization, 0-1."),
    ("sentinel_gpu_memory_used_bytes", "GPU memory in use."),
    ("sentinel_gpu_memory_total_bytes", "GPU memory in total."),
    ("sentinel_gpu_power_watts", "GPU power draw."),
    ("sentinel_gpu_temperature_celsius", "GPU temperature."),
    ("sentinel_gpu_sm_clock_hertz", "GPU SM clock."),
    (
        "sentinel_gpu_graphics_engine_active_ratio",
        "Time the graphics or compute engines were busy, 0-1 (DCGM_FI_PROF_GR_ENGINE_ACTIVE).",
    ),
    (
        "sentinel_gpu_tensor_active_ratio",
        "Time the tensor cores were busy, 0-1 (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).",
    ),
    (
        "sentinel_gpu_dram_active_ratio",
        "Time device memory was read or written, 0-1 (DCGM_FI_PROF_DRAM_ACTIVE).",
    ),
    (
        "sentinel_gpu_last_xid",
        "The last XID error the GPU driver reported; 0: none (DCGM_FI_DEV_XID_ERRORS).",
    ),
];

const GPU: &[&str] = &["target", "gpu", "uuid", "name", "mig"];

pub struct GpuMetrics {
    families: Vec<Gauges>,
}

impl GpuMetrics {
    pub fn new(page: &Page) -> Result<Self, MetricsError> {
        let families = FAMILIES
            .iter()
            .map(|(name, help)| page.gauges(name, help, GPU))
            .collect::<Result<_, MetricsError>>()?;
        Ok(GpuMetrics { families })
    }

    /// Replaces the target's GPU series with these readings.
    pub fn set_gpus(&self, target: &str, gpus: &[GpuReading]) {
        let readings: Vec<([&str; 5], [Option<f64>; 10])> = gpus
            .iter()
            .map(|g| ([target, &g.gpu, &g.uuid, &g.name, &g.mig], g.values()))
            .collect();
        for (i, family) in self.families.iter().enumerate() {
            let rows: Vec<(&[&str], f64)> = readings
                .iter()
                .filter_map(|(labels, values)| Some((&labels[..], values[i]?)))
                .collect();
            family.replace_target(target, &rows);
        }
    }
}
