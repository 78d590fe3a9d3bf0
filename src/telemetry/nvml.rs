//! GPU counters from NVML on the daemon's own host. The driver library is
//! loaded at run time; without it there is one log line and no GPU metrics.

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};

use crate::metrics::GpuReading;

/// An open NVML session, or the reason there is none.
pub struct LocalGpus {
    nvml: Option<Nvml>,
}

impl LocalGpus {
    /// Tries to load `libnvidia-ml.so`; logs once either way.
    pub fn open() -> LocalGpus {
        match Nvml::init() {
            Ok(nvml) => {
                let count = nvml.device_count().unwrap_or(0);
                tracing::info!(
                    gpus = count,
                    "NVML loaded: reading this host's GPU counters"
                );
                LocalGpus { nvml: Some(nvml) }
            }
            Err(e) => {
                tracing::info!("no NVIDIA driver on this host ({e}); host GPU metrics are off");
                LocalGpus { nvml: None }
            }
        }
    }

    pub fn available(&self) -> bool {
        self.nvml.is_some()
    }

    /// One reading per device; a counter a device does not support is missing.
    pub fn read(&self) -> Vec<GpuReading> {
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let count = nvml.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|i| nvml.device_by_index(i).ok())
            .enumerate()
            .map(|(i, d)| {
                let memory = d.memory_info().ok();
                GpuReading {
                    gpu: d.index().unwrap_or(i as u32).to_string(),
                    uuid: d.uuid().unwrap_or_default(),
                    name: d.name().unwrap_or_default(),
                    utilization_ratio: d.utilization_rates().ok().map(|u| f64::from(u.gpu) / 100.0),
                    memory_used_bytes: memory.as_ref().map(|m| m.used as f64),
                    memory_total_bytes: memory.as_ref().map(|m| m.total as f64),
                    power_watts: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                    temperature_celsius: d.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
                    sm_clock_hertz: d
                        .clock_info(Clock::SM)
                        .ok()
                        .map(|mhz| f64::from(mhz) * 1.0e6),
                }
            })
            .collect()
    }
}
