//! GPU counters from an NVIDIA DCGM exporter's `/metrics`, converted to
//! base units. DCGM reports "not available" as large blank values; those
//! become missing readings, never numbers.

use std::collections::BTreeMap;

use super::exposition::{Exposition, PageError};
use crate::vocabulary::gpu::GpuReading;
use crate::vocabulary::matchers::LabelMatchers;

/// DCGM's blank markers: INT64 blank is 0x7ffffffffffffff0 (about 9.2e18),
/// FP64 blank is 2^47, INT32 blank is 0x7ffffff0 and up.
fn is_blank(v: f64) -> bool {
    !v.is_finite()
        || v >= 9.0e18
        || v == 140_737_488_355_328.0
        || (2_147_483_632.0..=2_147_483_647.0).contains(&v)
}

const MIB: f64 = 1024.0 * 1024.0;

/// Where a DCGM field goes in a reading, in base units.
type Setter = fn(&mut Device, f64);

/// The fields read, each with its conversion to base units.
const FIELDS: [(&str, Setter); 10] = [
    ("DCGM_FI_DEV_GPU_UTIL", |d, v| {
        d.reading.utilization_ratio = Some(v / 100.0)
    }),
    ("DCGM_FI_DEV_FB_USED", |d, v| {
        d.reading.memory_used_bytes = Some(v * MIB)
    }),
    ("DCGM_FI_DEV_FB_FREE", |d, v| {
        d.fb_free_bytes = Some(v * MIB)
    }),
    ("DCGM_FI_DEV_POWER_USAGE", |d, v| {
        d.reading.power_watts = Some(v)
    }),
    ("DCGM_FI_DEV_GPU_TEMP", |d, v| {
        d.reading.temperature_celsius = Some(v)
    }),
    ("DCGM_FI_DEV_SM_CLOCK", |d, v| {
        d.reading.sm_clock_hertz = Some(v * 1.0e6)
    }),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", |d, v| {
        d.reading.graphics_engine_active_ratio = Some(v)
    }),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", |d, v| {
        d.reading.tensor_active_ratio = Some(v)
    }),
    ("DCGM_FI_PROF_DRAM_ACTIVE", |d, v| {
        d.reading.dram_active_ratio = Some(v)
    }),
    ("DCGM_FI_DEV_XID_ERRORS", |d, v| {
        d.reading.last_xid = Some(v)
    }),
];

/// One device being read: a GPU, or one MIG instance of it.
#[derive(Default)]
struct Device {
    reading: GpuReading,
    fb_free_bytes: Option<f64>,
    /// Whether one of its series passed the target's `dcgm_match`.
    selected: bool,
}

/// One reading per device (GPU index, then MIG instance), sorted. With
/// `select`, only the devices one of whose series it matches: the GPUs
/// serving the target on a node shared with others.
pub fn parse(text: &str, select: Option<&LabelMatchers>) -> Result<Vec<GpuReading>, PageError> {
    let e = Exposition::parse_families(text, &["DCGM_FI_DEV_", "DCGM_FI_PROF_"])?;
    let mut devices: BTreeMap<(u32, String, String), Device> = BTreeMap::new();
    for (name, set) in FIELDS {
        for s in e.scalars(&[name]) {
            let gpu = s.label("gpu").unwrap_or("").to_owned();
            let mig = match (s.label("GPU_I_PROFILE"), s.label("GPU_I_ID")) {
                (Some(profile), Some(id)) => format!("{profile}/{id}"),
                (None, Some(id)) => id.to_owned(),
                _ => String::new(),
            };
            let key = (gpu.parse().unwrap_or(u32::MAX), gpu.clone(), mig.clone());
            let device = devices.entry(key).or_insert_with(|| Device {
                reading: GpuReading {
                    gpu,
                    uuid: s.label("UUID").unwrap_or("").to_owned(),
                    name: s.label("modelName").unwrap_or("").to_owned(),
                    mig,
                    ..Default::default()
                },
                ..Default::default()
            });
            device.selected |= select.is_none_or(|m| m.matches(&s.labels));
            if !is_blank(s.value) {
                set(device, s.value);
            }
        }
    }
    let on_page = devices.len();
    if on_page == 0 {
        return Err(PageError::NoFamilies {
            expected: "DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_POWER_USAGE, ...",
        });
    }
    let readings: Vec<GpuReading> = devices
        .into_values()
        .filter(|d| d.selected)
        .map(|mut d| {
            // DCGM has no total by default: used + free is the framebuffer.
            if let (Some(used), Some(free)) = (d.reading.memory_used_bytes, d.fb_free_bytes) {
                d.reading.memory_total_bytes = Some(used + free);
            }
            d.reading
        })
        .collect();
    match select {
        Some(matchers) if readings.is_empty() => Err(PageError::NoneSelected {
            matchers: matchers.to_string(),
            on_page,
        }),
        _ => Ok(readings),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: &str = include_str!("../../tests/fixtures/dcgm-exporter-h100.txt");

    #[test]
    fn converts_to_base_units_and_drops_blank_values() {
        let gpus = parse(H100, None).unwrap();
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
