//! Where the self-test's two sides run: the reference simulator on a core
//! of its own at real-time priority, the client on the remaining cores, as
//! a server on another machine and the probe on this one would be.
//!
//! Why: on a small machine the client's and the simulator's threads share
//! the cores, and a simulator thread the kernel leaves waiting for a few
//! milliseconds reads requests and writes chunks that much late; the error
//! would be charged to the client. Raising the simulator can only make the
//! client's figures worse, never better (its threads preempt the client's
//! whenever they share a core), and pinning keeps them from sharing one.

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;
use thread_priority::{
    RealtimeThreadSchedulePolicy, ThreadId, ThreadPriority, ThreadPriorityValue,
    ThreadSchedulePolicy, set_thread_priority_and_policy, thread_native_id,
};

use crate::sim::timer;

/// SCHED_FIFO priority of the simulator's threads: above every normal
/// thread, far below the kernel's own real-time threads.
const REFERENCE_PRIORITY: u8 = 10;

/// How the self-test placed its two sides; printed with the report.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    /// The core the simulator's server and timer threads are pinned to.
    pub simulator_cpu: Option<usize>,
    /// The cores the client's timing runtime is pinned to (empty: the
    /// client runs on the caller's runtime, unpinned).
    pub client_cpus: Vec<usize>,
    /// SCHED_FIFO priority of the simulator's threads, when granted.
    pub simulator_realtime_priority: Option<u8>,
    /// What was not done, and why.
    pub notes: Vec<String>,
    /// Whether isolation was asked for at all.
    #[serde(skip)]
    isolate: bool,
}

impl Placement {
    /// Chooses the cores: the last allowed CPU for the simulator, the rest
    /// for the client. With `isolate` false, or fewer than two CPUs, both
    /// sides share every core.
    pub fn plan(isolate: bool) -> Placement {
        let mut placement = Placement {
            isolate,
            ..Placement::default()
        };
        if !isolate {
            placement.notes.push("isolation not requested".into());
            return placement;
        }
        match allowed_cpus() {
            Ok(cpus) if cpus.len() >= 2 => {
                let (client, simulator) = cpus.split_at(cpus.len() - 1);
                placement.simulator_cpu = Some(simulator[0]);
                placement.client_cpus = client.to_vec();
            }
            Ok(cpus) => placement.notes.push(format!(
                "{} CPU available: the simulator and the client share it",
                cpus.len()
            )),
            Err(e) => placement
                .notes
                .push(format!("cannot read the CPU affinity: {e}")),
        }
        placement
    }

    /// Pins the calling thread (the simulator's server thread) and the
    /// simulator's timer thread to their core and raises both to real-time
    /// priority. What the system refuses is noted and left undone.
    pub fn apply_to_simulator(&mut self) {
        if !self.isolate {
            return;
        }
        let timer = timer::timer_thread();
        if let Some(cpu) = self.simulator_cpu {
            let pinned = pin(Pid::from_raw(0), &[cpu]).and_then(|()| pin(timer.tid, &[cpu]));
            if let Err(e) = pinned {
                self.notes
                    .push(format!("cannot pin the simulator to CPU {cpu}: {e}"));
                self.simulator_cpu = None;
                self.client_cpus.clear();
            }
        }
        match make_realtime(thread_native_id()).and_then(|()| make_realtime(timer.pthread)) {
            Ok(()) => self.simulator_realtime_priority = Some(REFERENCE_PRIORITY),
            Err(e) => self.notes.push(format!(
                "real-time priority refused ({e}); run as root or with CAP_SYS_NICE"
            )),
        }
    }

    /// A runtime for the client whose threads stay on the client's cores,
    /// or `None` when the client is not isolated.
    pub fn client_runtime(&self) -> Option<std::io::Result<tokio::runtime::Runtime>> {
        if self.client_cpus.is_empty() {
            return None;
        }
        let placement = self.clone();
        Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(self.client_cpus.len())
                .thread_name("selftest-client")
                .on_thread_start(move || placement.pin_to_client_cpus())
                .enable_all()
                .build(),
        )
    }

    /// Keeps the calling thread on the client's cores (best effort: a
    /// thread that cannot be pinned still works).
    pub fn pin_to_client_cpus(&self) {
        if !self.client_cpus.is_empty() {
            let _ = pin(Pid::from_raw(0), &self.client_cpus);
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.simulator_cpu {
            Some(cpu) => write!(
                f,
                "simulator on CPU {cpu}, client on CPU {}",
                self.client_cpus
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )?,
            None => write!(f, "simulator and client share the CPUs")?,
        }
        match self.simulator_realtime_priority {
            Some(p) => write!(f, "; simulator at real-time priority (SCHED_FIFO {p})")?,
            None => write!(f, "; simulator at normal priority")?,
        }
        for note in &self.notes {
            write!(f, "; {note}")?;
        }
        Ok(())
    }
}

fn allowed_cpus() -> nix::Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(0))?;
    Ok((0..CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .collect())
}

/// Restricts a thread (0: the calling one) to `cpus`.
fn pin(thread: Pid, cpus: &[usize]) -> nix::Result<()> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)?;
    }
    sched_setaffinity(thread, &set)
}

/// Raises one thread to SCHED_FIFO at the reference priority.
fn make_realtime(thread: ThreadId) -> Result<(), String> {
    let value = ThreadPriorityValue::try_from(REFERENCE_PRIORITY).map_err(|e| e.to_string())?;
    set_thread_priority_and_policy(
        thread,
        ThreadPriority::Crossplatform(value),
        ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo),
    )
    .map_err(|e| match e {
        thread_priority::Error::OS(code) => std::io::Error::from_raw_os_error(code).to_string(),
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulator_gets_the_last_allowed_cpu_and_the_client_the_rest() {
        let cpus = allowed_cpus().unwrap();
        let placement = Placement::plan(true);
        if cpus.len() >= 2 {
            assert_eq!(placement.simulator_cpu, cpus.last().copied());
            assert_eq!(placement.client_cpus, cpus[..cpus.len() - 1]);
        } else {
            assert_eq!(placement.simulator_cpu, None);
            assert!(placement.notes[0].contains("share"), "{placement:?}");
        }
        let shared = Placement::plan(false);
        assert_eq!((shared.simulator_cpu, shared.client_cpus.len()), (None, 0));
        assert!(shared.client_runtime().is_none());
        assert_eq!(
            shared.to_string(),
            "simulator and client share the CPUs; simulator at normal priority; isolation not requested"
        );
    }
}
