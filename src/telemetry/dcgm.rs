//! GPU counters from an NVIDIA DCGM exporter's `/metrics`, converted to
//! base units. DCGM reports "not available" as large blank values; those
//! become missing readings, never numbers.

use std::collections::BTreeMap;

use super::exposition::{Exposition, ExpositionError};
use crate::metrics::GpuReading;

/// DCGM's blank markers: INT64 blank is 0x7ffffffffffffff0 (about 9.2e18),
/// FP64 blank is 2^47, INT32 blank is 0x7ffffff0 and up.
fn is_blank(v: f64) -> bool {
    !v.is_finite()
        || v >= 9.0e18
        || v == 140_737_488_355_328.0
        || (2_147_483_632.0..=2_147_483_647.0).contains(&v)
}

const MIB: f64 = 1024.0 * 1024.0;

/// One reading per GPU (by `gpu` index label), sorted by index.
pub fn parse(text: &str) -> Result<Vec<GpuReading>, ExpositionError> {
    let e = Exposition::parse_families(text, &["DCGM_FI_DEV_"])?;
    let mut gpus: BTreeMap<(u32, String), GpuReading> = BTreeMap::new();
    let mut fb_free: BTreeMap<(u32, String), f64> = BTreeMap::new();
    let fields: [(&str, f64); 6] = [
        ("DCGM_FI_DEV_GPU_UTIL", 0.01),
        ("DCGM_FI_DEV_FB_USED", MIB),
        ("DCGM_FI_DEV_FB_FREE", MIB),
        ("DCGM_FI_DEV_POWER_USAGE", 1.0),
        ("DCGM_FI_DEV_GPU_TEMP", 1.0),
        ("DCGM_FI_DEV_SM_CLOCK", 1.0e6),
    ];
    for (name, scale) in fields {
        for s in e.scalars(&[name]) {
            let gpu = s.label("gpu").unwrap_or("").to_owned();
            let key = (gpu.parse().unwrap_or(u32::MAX), gpu.clone());
            let reading = gpus.entry(key.clone()).or_insert_with(|| GpuReading {
                gpu: gpu.clone(),
                uuid: s.label("UUID").unwrap_or("").to_owned(),
                name: s.label("modelName").unwrap_or("").to_owned(),
                ..Default::default()
            });
            if is_blank(s.value) {
                continue;
            }
            let v = s.value * scale;
            match name {
                "DCGM_FI_DEV_GPU_UTIL" => reading.utilization_ratio = Some(v),
                "DCGM_FI_DEV_FB_USED" => reading.memory_used_bytes = Some(v),
                "DCGM_FI_DEV_FB_FREE" => {
                    fb_free.insert(key, v);
                }
                "DCGM_FI_DEV_POWER_USAGE" => reading.power_watts = Some(v),
                "DCGM_FI_DEV_GPU_TEMP" => reading.temperature_celsius = Some(v),
                _ => reading.sm_clock_hertz = Some(v),
            }
        }
    }
    // DCGM has no total by default: used + free is the framebuffer.
    for (key, reading) in gpus.iter_mut() {
        if let (Some(used), Some(free)) = (reading.memory_used_bytes, fb_free.get(key)) {
            reading.memory_total_bytes = Some(used + free);
        }
    }
    Ok(gpus.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: &str = include_str!("../../tests/fixtures/dcgm-exporter-h100.txt");

    #[test]
    fn converts_to_base_units_and_drops_blank_values() {
        let gpus = parse(H100).unwrap();
        assert_eq!(gpus.len(), 2);
        let g0 = &gpus[0];
        assert_eq!(g0.gpu, "0");
        assert_eq!(g0.uuid, "GPU-927d7444-b45a-7c49-8402-5e686e46a026");
        assert_eq!(g0.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(g0.utilization_ratio, Some(0.87));
        assert_eq!(g0.memory_used_bytes, Some(76284.0 * MIB));
        assert_eq!(g0.memory_total_bytes, Some((76284.0 + 3274.0) * MIB));
        assert_eq!(g0.power_watts, Some(312.406));
        assert_eq!(g0.temperature_celsius, Some(52.0));
        assert_eq!(g0.sm_clock_hertz, Some(1980.0e6));
        // GPU 1 reports utilization as DCGM's INT64 blank.
        assert_eq!(gpus[1].utilization_ratio, None);
        assert_eq!(gpus[1].temperature_celsius, Some(48.0));
    }

    #[test]
    fn blank_markers() {
        assert!(is_blank(9_223_372_036_854_775_794.0));
        assert!(is_blank(140_737_488_355_328.0));
        assert!(is_blank(2_147_483_632.0));
        assert!(!is_blank(312.4));
    }
}
