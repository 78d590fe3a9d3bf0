//! GPU counters from NVML on the daemon's own host. The driver library is
//! loaded at run time; without it there is one log line and no GPU metrics.
//! The profiling ratios come from NVML's GPM (Hopper and later: the same
//! counters as DCGM's `PROF` fields, between two samples), XID errors from
//! NVML's events, and each MIG instance is a device of its own.

use std::collections::HashMap;
use std::sync::Mutex;

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::event::EventSet;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use nvml_wrapper::{Device, Nvml, bitmasks::event::EventTypes};

use crate::vocabulary::gpu::GpuReading;

/// GPM metrics in the order of the reading's ratio fields.
const GPM_METRICS: [GpmMetricId; 3] = [
    GpmMetricId::GraphicsUtil,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
];

/// What is carried from one read to the next, by device UUID.
#[derive(Default)]
struct Carried {
    gpm_before: HashMap<String, GpmSample<'static>>,
    last_xid: HashMap<String, f64>,
}

/// An open NVML session, or the reason there is none.
pub struct LocalGpus {
    /// Opened once and kept for the life of the process, so samples and
    /// event sets can borrow it across reads.
    nvml: Option<&'static Nvml>,
    xid_events: Mutex<Option<EventSet<'static>>>,
    carried: Mutex<Carried>,
}

impl LocalGpus {
    /// Tries to load `libnvidia-ml.so`; logs once either way.
    pub fn open() -> LocalGpus {
        let nvml = match Nvml::init() {
            Ok(nvml) => {
                let count = nvml.device_count().unwrap_or(0);
                tracing::info!(
                    gpus = count,
                    "NVML loaded: reading this host's GPU counters"
                );
                Some(&*Box::leak(Box::new(nvml)))
            }
            Err(e) => {
                tracing::info!("no NVIDIA driver on this host ({e}); host GPU metrics are off");
                None
            }
        };
        let xid_events = nvml.and_then(register_xid_events);
        LocalGpus {
            nvml,
            xid_events: Mutex::new(xid_events),
            carried: Mutex::new(Carried::default()),
        }
    }

    pub fn available(&self) -> bool {
        self.nvml.is_some()
    }

    /// One reading per device and per MIG instance; a counter a device
    /// does not support is missing.
    pub fn read(&self) -> Vec<GpuReading> {
        let Some(nvml) = self.nvml else {
            return Vec::new();
        };
        let mut carried = self.carried.lock().unwrap_or_else(|p| p.into_inner());
        self.drain_xid_events(&mut carried);
        let count = nvml.device_count().unwrap_or(0);
        let mut readings = Vec::new();
        for (i, device) in (0..count)
            .filter_map(|i| nvml.device_by_index(i).ok())
            .enumerate()
        {
            let mut reading = basic_reading(&device, device.index().unwrap_or(i as u32));
            let ratios = gpm_ratios(nvml, &device, &reading.uuid, &mut carried);
            reading.graphics_engine_active_ratio = ratios[0];
            reading.tensor_active_ratio = ratios[1];
            reading.dram_active_ratio = ratios[2];
            reading.last_xid = carried.last_xid.get(&reading.uuid).copied();
            readings.extend(mig_readings(&device, &reading));
            readings.push(reading);
        }
        readings.sort_by(|a, b| (&a.gpu, &a.mig).cmp(&(&b.gpu, &b.mig)));
        readings
    }

    /// The last XID of each device since the previous read.
    fn drain_xid_events(&self, carried: &mut Carried) {
        let events = self.xid_events.lock().unwrap_or_else(|p| p.into_inner());
        let Some(events) = events.as_ref() else {
            return;
        };
        while let Ok(event) = events.wait(0) {
            if let (Some(XidError::Value(xid)), Ok(uuid)) = (event.event_data, event.device.uuid())
            {
                carried.last_xid.insert(uuid, xid as f64);
            }
        }
    }
}

/// XID events of every device that has them; each such device starts at
/// 0 (no XID since the daemon started).
fn register_xid_events(nvml: &'static Nvml) -> Option<EventSet<'static>> {
    let mut set = nvml.create_event_set().ok()?;
    for device in (0..nvml.device_count().ok()?).filter_map(|i| nvml.device_by_index(i).ok()) {
        let supported = device
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        if supported {
            set = device
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .ok()?;
        }
    }
    Some(set)
}

/// The counters every device has, under GPU index `gpu`.
fn basic_reading(d: &Device<'_>, gpu: u32) -> GpuReading {
    let memory = d.memory_info().ok();
    GpuReading {
        gpu: gpu.to_string(),
        uuid: d.uuid().unwrap_or_default(),
        name: d.name().unwrap_or_default(),
        mig: String::new(),
        utilization_ratio: d.utilization_rates().ok().map(|u| f64::from(u.gpu) / 100.0),
        memory_used_bytes: memory.as_ref().map(|m| m.used as f64),
        memory_total_bytes: memory.as_ref().map(|m| m.total as f64),
        power_watts: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        temperature_celsius: d.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
        sm_clock_hertz: d
            .clock_info(Clock::SM)
            .ok()
            .map(|mhz| f64::from(mhz) * 1.0e6),
        ..Default::default()
    }
}

/// Graphics engine, tensor and DRAM activity (0-1) between the previous
/// read's GPM sample and this one; `None`s without GPM or on the first read.
fn gpm_ratios(
    nvml: &'static Nvml,
    device: &Device<'static>,
    uuid: &str,
    carried: &mut Carried,
) -> [Option<f64>; 3] {
    let mut ratios = [None; 3];
    if !device.gpm_support().unwrap_or(false) {
        return ratios;
    }
    let Ok(now) = device.gpm_sample() else {
        return ratios;
    };
    if let Some(before) = carried.gpm_before.get(uuid)
        && let Ok(results) = gpm_metrics_get(nvml, before, &now, &GPM_METRICS)
    {
        for (ratio, result) in ratios.iter_mut().zip(results) {
            *ratio = result.ok().map(|r| r.value / 100.0);
        }
    }
    carried.gpm_before.insert(uuid.to_owned(), now);
    ratios
}

/// Each MIG instance of a GPU in MIG mode, as its own device: its memory,
/// under the GPU's index, named `<profile>/<index>`.
fn mig_readings(device: &Device<'_>, whole: &GpuReading) -> Vec<GpuReading> {
    let in_mig_mode = device.mig_mode().is_ok_and(|m| m.current == 1);
    if !in_mig_mode {
        return Vec::new();
    }
    let slots = device.mig_device_count().unwrap_or(0);
    (0..slots)
        .filter_map(|i| device.mig_device_by_index(i).ok().map(|m| (i, m)))
        .map(|(i, mig)| {
            let name = mig.name().unwrap_or_default();
            // "NVIDIA A100-SXM4-40GB MIG 1g.5gb": the profile follows "MIG ".
            let profile = name.rsplit_once("MIG ").map_or("mig", |(_, p)| p.trim());
            let memory = mig.memory_info().ok();
            GpuReading {
                gpu: whole.gpu.clone(),
                uuid: mig.uuid().unwrap_or_default(),
                name: whole.name.clone(),
                mig: format!("{profile}/{i}"),
                memory_used_bytes: memory.as_ref().map(|m| m.used as f64),
                memory_total_bytes: memory.as_ref().map(|m| m.total as f64),
                ..Default::default()
            }
        })
        .collect()
}
