//! The self-test's reference server: the simulator on a thread and runtime
//! of its own, placed (core, priority) as `placement` decides.

use std::sync::Arc;

use super::placement::Placement;
use crate::probe::ProbeError;
use crate::sim::{SimConfig, SimHandle, SimState};

pub struct SimThread {
    pub base_url: String,
    pub state: Arc<SimState>,
    /// Where the simulator ended up, with what the system refused.
    pub placement: Placement,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SimThread {
    /// Starts the simulator on its own thread; that thread and the
    /// simulator's timer are pinned and raised as `placement` plans.
    pub fn start(config: SimConfig, mut placement: Placement) -> Result<SimThread, ProbeError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("selftest-sim".into())
            .spawn(move || {
                placement.apply_to_simulator();
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    match SimHandle::start("127.0.0.1:0", config).await {
                        Ok(sim) => {
                            let _ =
                                ready_tx.send(Ok((sim.base_url(), sim.state.clone(), placement)));
                            let _ = stopped.await;
                            sim.stop().await;
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                        }
                    }
                });
            })
            .map_err(|e| ProbeError::Invalid(format!("cannot start the simulator: {e}")))?;
        let (base_url, state, placement) = ready_rx
            .recv()
            .map_err(|e| e.to_string())
            .and_then(|r| r)
            .map_err(|e| ProbeError::Invalid(format!("cannot start the simulator: {e}")))?;
        Ok(SimThread {
            base_url,
            state,
            placement,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for SimThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
