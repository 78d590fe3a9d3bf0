//! GPU counters per target, from NVML on this host or a DCGM exporter:
//! each reading replaces the target's series as a whole, so a GPU that
//! disappears loses its series.

use super::MetricsError;
use super::page::{LastWritten, Page, TargetSeries};

/// GPU counters from NVML or a DCGM exporter.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuReading {
    pub gpu: String,
    pub uuid: String,
    pub name: String,
    pub utilization_ratio: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub memory_total_bytes: Option<f64>,
    pub power_watts: Option<f64>,
    pub temperature_celsius: Option<f64>,
    pub sm_clock_hertz: Option<f64>,
}

const GPU: &[&str] = &["target", "gpu", "uuid", "name"];

pub struct GpuMetrics {
    /// utilization, memory used, memory total, power, temperature, SM clock.
    families: [TargetSeries; 6],
    last: LastWritten<Vec<GpuReading>>,
}

impl GpuMetrics {
    pub fn new(page: &Page) -> Result<Self, MetricsError> {
        let family = |name: &str, help: &str| -> Result<TargetSeries, MetricsError> {
            Ok(TargetSeries::new(page.gauges(name, help, GPU)?))
        };
        Ok(GpuMetrics {
            families: [
                family("sentinel_gpu_utilization_ratio", "GPU utilization, 0-1.")?,
                family("sentinel_gpu_memory_used_bytes", "GPU memory in use.")?,
                family("sentinel_gpu_memory_total_bytes", "GPU memory in total.")?,
                family("sentinel_gpu_power_watts", "GPU power draw.")?,
                family("sentinel_gpu_temperature_celsius", "GPU temperature.")?,
                family("sentinel_gpu_sm_clock_hertz", "GPU SM clock.")?,
            ],
            last: LastWritten::default(),
        })
    }

    /// Replaces the target's GPU series with these readings.
    pub fn set_gpus(&self, target: &str, gpus: &[GpuReading]) {
        if !self.last.differs(target, gpus.to_vec()) {
            return;
        }
        for f in &self.families {
            f.clear(target);
        }
        for g in gpus {
            let labels = [target, g.gpu.as_str(), g.uuid.as_str(), g.name.as_str()];
            let values = [
                g.utilization_ratio,
                g.memory_used_bytes,
                g.memory_total_bytes,
                g.power_watts,
                g.temperature_celsius,
                g.sm_clock_hertz,
            ];
            for (family, value) in self.families.iter().zip(values) {
                if let Some(v) = value {
                    family.add(&labels, v);
                }
            }
        }
    }
}
