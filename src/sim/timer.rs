//! A sub-millisecond timer for the simulator. tokio's timer wheel rounds
//! every deadline up to the next millisecond; the simulator's injected TTFT
//! and ITL must be exact to test the client's own timing error, so one
//! thread keeps a heap of deadlines and wakes each waiter on time.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Instant;

use tokio::sync::oneshot;

struct Entry {
    deadline: Instant,
    seq: u64,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.deadline, self.seq).cmp(&(other.deadline, other.seq))
    }
}

#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Reverse<Entry>>,
    seq: u64,
}

struct PreciseTimer {
    queue: Mutex<Queue>,
    changed: Condvar,
}

/// The timer and its thread's identities.
struct Started {
    timer: &'static PreciseTimer,
    thread: TimerThread,
}

/// The timer thread's identities, for the self-test, which raises its
/// scheduling priority and pins it to a core so that the simulator's
/// schedule stays a precise reference.
#[derive(Debug, Clone, Copy)]
pub struct TimerThread {
    /// pthread handle (scheduling policy).
    pub pthread: std::os::unix::thread::RawPthread,
    /// Kernel thread id (CPU affinity).
    pub tid: nix::unistd::Pid,
}

fn started() -> &'static Started {
    static STARTED: OnceLock<Started> = OnceLock::new();
    STARTED.get_or_init(|| {
        use std::os::unix::thread::JoinHandleExt;
        let timer: &'static PreciseTimer = Box::leak(Box::new(PreciseTimer {
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
        }));
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("sim-timer".into())
            .spawn(move || {
                let _ = tid_tx.send(nix::unistd::gettid());
                timer.run()
            })
            .expect("spawning the simulator timer thread");
        let tid = tid_rx
            .recv()
            .expect("the timer thread reports its id before anything else");
        // The thread runs for the life of the process; dropping the handle
        // detaches it.
        let pthread = thread.as_pthread_t();
        Started {
            timer,
            thread: TimerThread { pthread, tid },
        }
    })
}

fn timer() -> &'static PreciseTimer {
    started().timer
}

/// The timer thread (started if needed).
pub fn timer_thread() -> TimerThread {
    started().thread
}

impl PreciseTimer {
    fn run(&self) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = Instant::now();
            while queue
                .heap
                .peek()
                .is_some_and(|Reverse(e)| e.deadline <= now)
            {
                let Reverse(entry) = queue.heap.pop().expect("peeked");
                let _ = entry.wake.send(());
            }
            queue = match queue.heap.peek() {
                None => self.changed.wait(queue).unwrap_or_else(|p| p.into_inner()),
                Some(Reverse(e)) => {
                    let wait = e.deadline.saturating_duration_since(now);
                    self.changed
                        .wait_timeout(queue, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }
}

/// Waits until `deadline` with sub-millisecond precision.
pub async fn sleep_until(deadline: Instant) {
    if deadline <= Instant::now() {
        return;
    }
    let (wake, woken) = oneshot::channel();
    let timer = timer();
    {
        let mut queue = timer.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.seq += 1;
        let seq = queue.seq;
        let earliest = queue
            .heap
            .peek()
            .is_none_or(|Reverse(e)| deadline < e.deadline);
        queue.heap.push(Reverse(Entry {
            deadline,
            seq,
            wake,
        }));
        if earliest {
            timer.changed.notify_one();
        }
    }
    let _ = woken.await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn wakes_after_the_deadline_and_soon() {
        let base = Instant::now();
        let mut handles = Vec::new();
        for ms in [15u64, 5, 10] {
            handles.push(tokio::spawn(async move {
                let deadline = base + Duration::from_millis(ms);
                sleep_until(deadline).await;
                let now = Instant::now();
                assert!(now >= deadline, "woke early");
                now.duration_since(deadline)
            }));
        }
        for h in handles {
            let late = h.await.unwrap();
            assert!(late < Duration::from_millis(200), "woke {late:?} late");
        }
        // A deadline in the past returns at once.
        sleep_until(base).await;
    }
}
