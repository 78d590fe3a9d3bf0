//! One GPU's counters, as NVML or a DCGM exporter reads them.

/// GPU counters from NVML or a DCGM exporter, for a whole GPU or one MIG
/// instance of it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuReading {
    pub gpu: String,
    pub uuid: String,
    pub name: String,
    /// The MIG instance (`<profile>/<instance id>`); empty for a whole GPU.
    pub mig: String,
    pub utilization_ratio: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub memory_total_bytes: Option<f64>,
    pub power_watts: Option<f64>,
    pub temperature_celsius: Option<f64>,
    pub sm_clock_hertz: Option<f64>,
    /// Time the graphics or compute engines were busy, 0-1.
    pub graphics_engine_active_ratio: Option<f64>,
    /// Time the tensor cores were busy, 0-1.
    pub tensor_active_ratio: Option<f64>,
    /// Time device memory was being read or written, 0-1.
    pub dram_active_ratio: Option<f64>,
    /// The last XID error the driver reported; 0: none.
    pub last_xid: Option<f64>,
}
