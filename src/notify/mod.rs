//! Notifications of confirmed verdicts: a regression starting and ending
//! becomes one message per target and group window, to email, webhooks
//! and Alertmanager. Deduplicated (a pair already firing is not announced
//! again), rate-limited per target, retried with backoff; failures are
//! counted and logged and never touch the verdict, which stays in the
//! store and on `/metrics`.

pub mod channels;
pub mod message;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::config::live::LiveConfig;
use crate::metrics::verdicts::NotificationMetrics;
use crate::store::baselines::PairKey;
use crate::verdict::State;
use crate::verdict::pair::PairVerdict;
use message::{Group, Status};

enum Command {
    /// A fresh verdict.
    Verdict(Box<PairVerdict>),
    /// A regression confirmed before a restart: already announced.
    Restore(Box<PairVerdict>),
    /// The daemon stops: what waits to be said goes out now.
    Finish,
}

/// The daemon's handle; cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    tx: mpsc::UnboundedSender<Command>,
}

/// The receiving end, handed to [`spawn`].
pub struct Inbox(mpsc::UnboundedReceiver<Command>);

pub fn channel() -> (Notifier, Inbox) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Notifier { tx }, Inbox(rx))
}

impl Notifier {
    pub fn verdict(&self, v: &PairVerdict) {
        // The receiver lives as long as the daemon; after shutdown there is
        // nobody to tell.
        let _ = self.tx.send(Command::Verdict(Box::new(v.clone())));
    }

    pub fn restore(&self, v: &PairVerdict) {
        let _ = self.tx.send(Command::Restore(Box::new(v.clone())));
    }

    /// Sends what waits for its group window or its target's interval,
    /// once, and ends the notifier (after every verdict told before).
    pub fn finish(&self) {
        let _ = self.tx.send(Command::Finish);
    }
}

#[derive(Default)]
struct Pending {
    since: Option<Instant>,
    firing: BTreeMap<PairKey, PairVerdict>,
    resolved: BTreeMap<PairKey, PairVerdict>,
    /// When each alert in `resolved` began: its end is posted with it.
    began: BTreeMap<PairKey, DateTime<Utc>>,
}

struct Firing {
    verdict: PairVerdict,
    started: DateTime<Utc>,
    /// Verdicts of its (target, scenario) under another model since its
    /// own last one.
    others_since: u32,
}

/// Verdicts of a pair's (target, scenario) under another model, and none
/// of its own, after which its model no longer serves the target: fewer,
/// and a fleet serving two models at once in a rollout ends and starts
/// its alert again and again.
const OTHER_MODEL_VERDICTS: u32 = 3;

#[derive(Default)]
struct Ledger {
    firing: HashMap<PairKey, Firing>,
    pending: HashMap<String, Pending>,
    last_sent: HashMap<String, Instant>,
}

impl Ledger {
    /// Takes a fresh verdict; returns the alerts it ends without a word of
    /// their own: those of its (target, scenario) under another model that
    /// has had no verdict for [`OTHER_MODEL_VERDICTS`] of this one's, so
    /// no longer serves the target.
    fn accept(&mut self, v: PairVerdict) -> Vec<Firing> {
        let mut gone = Vec::new();
        for (k, f) in self.firing.iter_mut() {
            if k.target != v.target || k.scenario != v.scenario {
                continue;
            }
            if k.model == v.model {
                f.others_since = 0;
            } else {
                f.others_since += 1;
                if f.others_since >= OTHER_MODEL_VERDICTS {
                    gone.push(k.clone());
                }
            }
        }
        let served_before = self.retire(|k| !gone.contains(k));
        self.take(v);
        served_before
    }

    /// Ends the alerts of the pairs `watched` no longer holds (a target or
    /// scenario the configuration dropped, or one restored after a restart
    /// that the configuration no longer has): no verdict will end them,
    /// and Alertmanager would be told they fire for ever. Those not yet
    /// announced are dropped; the others are returned, for their end to
    /// be posted.
    fn retire(&mut self, watched: impl Fn(&PairKey) -> bool) -> Vec<Firing> {
        let gone: Vec<PairKey> = self
            .firing
            .keys()
            .filter(|k| !watched(k))
            .cloned()
            .collect();
        let mut ended = Vec::new();
        for key in gone {
            let announced = match self.pending.get_mut(&key.target) {
                Some(pending) => {
                    let waiting = pending.firing.remove(&key).is_some();
                    if pending.firing.is_empty() && pending.resolved.is_empty() {
                        pending.since = None;
                    }
                    !waiting
                }
                None => true,
            };
            if let Some(firing) = self.firing.remove(&key).filter(|_| announced) {
                ended.push(firing);
            }
        }
        ended
    }

    fn take(&mut self, v: PairVerdict) {
        let key = v.key();
        let pending = self.pending.entry(v.target.clone()).or_default();
        match (v.state, self.firing.contains_key(&key)) {
            (State::Regression, false) => {
                // Back before its resolution went out: it was announced
                // and never said to end, so nothing new is said, and it
                // goes on from when it began.
                let began = pending.began.remove(&key);
                if pending.resolved.remove(&key).is_none() {
                    pending.since.get_or_insert_with(Instant::now);
                    pending.firing.insert(key.clone(), v.clone());
                }
                self.firing.insert(
                    key,
                    Firing {
                        started: began.unwrap_or(v.at),
                        verdict: v,
                        others_since: 0,
                    },
                );
            }
            (State::Regression, true) => {
                if let Some(f) = self.firing.get_mut(&key) {
                    f.verdict = v;
                }
            }
            (State::Ok, true) => {
                let began = self.firing.remove(&key).map(|f| f.started);
                // Flapped back before the announcement went out: say nothing.
                if pending.firing.remove(&key).is_none() {
                    pending.since.get_or_insert_with(Instant::now);
                    if let Some(began) = began {
                        pending.began.insert(key.clone(), began);
                    }
                    pending.resolved.insert(key, v);
                }
            }
            // Inconclusive neither starts nor ends an alert.
            _ => {}
        }
        if pending.firing.is_empty() && pending.resolved.is_empty() {
            pending.since = None;
        }
    }

    /// Groups whose window closed and whose target may be told again.
    fn due(&mut self, group_wait: Duration, min_interval: Duration) -> Vec<Group> {
        let mut out = Vec::new();
        for (target, pending) in self.pending.iter_mut() {
            let Some(since) = pending.since else { continue };
            let rested = self
                .last_sent
                .get(target)
                .is_none_or(|t| t.elapsed() >= min_interval);
            if since.elapsed() < group_wait || !rested {
                continue;
            }
            for (status, verdicts) in [
                (Status::Firing, std::mem::take(&mut pending.firing)),
                (Status::Resolved, std::mem::take(&mut pending.resolved)),
            ] {
                if !verdicts.is_empty() {
                    let began = match status {
                        Status::Resolved => std::mem::take(&mut pending.began),
                        Status::Firing => BTreeMap::new(),
                    };
                    out.push(Group {
                        target: target.clone(),
                        status,
                        verdicts: verdicts.into_values().collect(),
                        began,
                    });
                }
            }
            pending.since = None;
            self.last_sent.insert(target.clone(), Instant::now());
        }
        out
    }
}

/// What delivering needs: the settings (reloadable), an HTTP client, the
/// counters of what was sent, and the shutdown that ends retries.
#[derive(Clone)]
pub struct Delivery {
    pub live: Arc<LiveConfig>,
    pub http: reqwest::Client,
    pub metrics: Arc<NotificationMetrics>,
    pub shutdown: CancellationToken,
    pub clock: crate::clock::Clock,
}

/// Runs the notifier until [`Notifier::finish`] (or every notifier is
/// dropped). Shutdown ends retries and the Alertmanager resends, not the
/// notifier: verdicts of runs finishing within the shutdown grace still
/// come, and are said at the finish.
pub fn spawn(delivery: Delivery, inbox: Inbox) -> JoinHandle<()> {
    tokio::spawn(run(delivery, inbox))
}

async fn run(delivery: Delivery, mut inbox: Inbox) {
    let mut state = Ledger::default();
    let mut last_resend = Instant::now();
    // The resend being delivered: while an Alertmanager that is away has
    // it retried, no other starts (each would hold every alert, and all
    // would post at once when it is back).
    let mut resending: Option<JoinHandle<()>> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        // With nothing waiting to go out and nothing firing, sleep until a
        // verdict arrives instead of waking five times a second.
        let idle = state.firing.is_empty() && state.pending.values().all(|p| p.since.is_none());
        tokio::select! {
            command = inbox.0.recv() => match command {
                None | Some(Command::Finish) => {
                    flush(&delivery, &mut state).await;
                    return;
                }
                Some(Command::Verdict(v)) => {
                    let ended = state.accept(*v);
                    end_alerts(&delivery, &delivery.live.current(), ended, "its model no longer serves the target");
                }
                Some(Command::Restore(v)) => {
                    let v = *v;
                    if v.state == State::Regression {
                        state.firing.insert(v.key(), Firing { started: v.at, verdict: v, others_since: 0 });
                    }
                }
            },
            _ = tick.tick(), if !idle && !delivery.shutdown.is_cancelled() => {
                let config = delivery.live.current();
                let ended = state.retire(|k| watched(&config, k));
                end_alerts(&delivery, &config, ended, "the configuration no longer probes it");
                let n = &config.notify;
                for group in state.due(n.group_wait, n.min_interval) {
                    send_group(&delivery, &config, &state, group);
                }
                if let Some(am) = &n.alertmanager
                    && last_resend.elapsed() >= am.resend_interval
                    && resending.as_ref().is_none_or(JoinHandle::is_finished)
                {
                    last_resend = Instant::now();
                    resending = resend_firing(&delivery, &config, &state);
                }
            }
        }
    }
}

/// Sends every group still waiting, whatever its window or interval,
/// and waits for each delivery's one try (shutdown has ended retries), at
/// most [`FLUSH_WAIT`]: a stopping daemon must end within its
/// supervisor's grace.
async fn flush(delivery: &Delivery, state: &mut Ledger) {
    let config = delivery.live.current();
    let mut sent = Vec::new();
    for group in state.due(Duration::ZERO, Duration::ZERO) {
        tracing::info!(target = %group.target, "the daemon stops: sending what waited for its window");
        sent.extend(send_group(delivery, &config, state, group));
    }
    let all = futures_util::future::join_all(sent);
    if tokio::time::timeout(FLUSH_WAIT, all).await.is_err() {
        tracing::warn!(
            "the daemon stops: a notification still unsent after {FLUSH_WAIT:?} is dropped"
        );
    }
}

/// How long a stopping daemon waits for its last notifications.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Whether the configuration still probes the pair's target and scenario.
fn watched(config: &Config, key: &PairKey) -> bool {
    config
        .target(&key.target)
        .is_some_and(|t| t.scenarios.contains(&key.scenario))
}

/// Posts the end of alerts no verdict will end, to Alertmanager (email
/// and webhooks announced a regression, and say nothing more of a pair
/// that is gone); logged with `why`.
fn end_alerts(delivery: &Delivery, config: &Arc<Config>, ended: Vec<Firing>, why: &str) {
    if ended.is_empty() {
        return;
    }
    for f in &ended {
        let v = &f.verdict;
        tracing::info!(
            target = %v.target, model = %v.model, scenario = %v.scenario,
            "alert ended: {why}"
        );
    }
    let Some(am) = &config.notify.alertmanager else {
        return;
    };
    let (confidence, external) = (
        config.verdict_policy.detector.confidence,
        config.notify.external_url.as_deref(),
    );
    let now = delivery.clock.now();
    let alerts = ended
        .iter()
        .map(|f| {
            let v = &f.verdict;
            let mut alert = message::alertmanager_alert(
                v,
                Status::Resolved,
                f.started,
                now,
                external,
                confidence,
            );
            // Not "back to its baseline": nothing was measured.
            alert["annotations"]["summary"] =
                format!("{} / {} ({}): ended, {why}", v.target, v.scenario, v.model).into();
            alert
        })
        .collect();
    post_alerts(delivery, config, am.url.clone(), alerts);
}

/// How long a posted firing alert stays active without being re-sent:
/// long enough to survive missed resends, short enough that a stopped
/// daemon's alerts end by themselves.
fn alert_lifetime(config: &Config) -> chrono::Duration {
    let resend = config
        .notify
        .alertmanager
        .as_ref()
        .map_or(Duration::from_secs(60), |a| a.resend_interval);
    chrono::Duration::from_std(resend * 4).unwrap_or(chrono::Duration::minutes(4))
}

fn alerts_for(
    config: &Config,
    group: &Group,
    state: &Ledger,
    now: DateTime<Utc>,
) -> Vec<serde_json::Value> {
    let confidence = config.verdict_policy.detector.confidence;
    let external = config.notify.external_url.as_deref();
    group
        .verdicts
        .iter()
        .map(|v| {
            let (started, ends) = match group.status {
                Status::Firing => (
                    state.firing.get(&v.key()).map_or(v.at, |f| f.started),
                    now + alert_lifetime(config),
                ),
                // Its own start: an Alertmanager that no longer holds
                // the alert (restarted, or its resolve timeout passed)
                // would show the resolution as the start.
                Status::Resolved => (group.began.get(&v.key()).copied().unwrap_or(v.at), now),
            };
            message::alertmanager_alert(v, group.status, started, ends, external, confidence)
        })
        .collect()
}

fn send_group(
    delivery: &Delivery,
    config: &Arc<Config>,
    state: &Ledger,
    group: Group,
) -> Vec<JoinHandle<()>> {
    let mut sent = Vec::new();
    let n = &config.notify;
    let confidence = config.verdict_policy.detector.confidence;
    let external = n.external_url.as_deref();
    tracing::info!(
        target = %group.target,
        status = ?group.status,
        scenarios = group.verdicts.len(),
        "notifying"
    );
    if let Some(email) = n.email.clone() {
        let subject = message::subject(&group);
        let body = message::text(&group, external, confidence);
        sent.push(deliver(
            delivery,
            config,
            ("email", "email".into(), n.max_attempts),
            move |timeout| {
                let (email, subject, body) = (email.clone(), subject.clone(), body.clone());
                async move { channels::email(&email, &subject, &body, timeout).await }
            },
        ));
    }
    let body = message::webhook_body(&group, external, confidence);
    for hook in n.webhooks.clone() {
        let http = delivery.http.clone();
        let body = body.clone();
        let name = hook.name.clone();
        sent.push(deliver(
            delivery,
            config,
            ("webhook", name, n.max_attempts),
            move |timeout| {
                let (http, hook, body) = (http.clone(), hook.clone(), body.clone());
                async move { channels::webhook(&http, &hook, &body, timeout).await }
            },
        ));
    }
    if let Some(am) = n.alertmanager.clone() {
        let alerts = alerts_for(config, &group, state, delivery.clock.now());
        sent.push(post_alerts(delivery, config, am.url, alerts));
    }
    sent
}

fn post_alerts(
    delivery: &Delivery,
    config: &Arc<Config>,
    url: String,
    alerts: Vec<serde_json::Value>,
) -> JoinHandle<()> {
    post_alerts_tried(delivery, config, url, alerts, config.notify.max_attempts)
}

/// [`post_alerts`], tried at most `tries` times.
fn post_alerts_tried(
    delivery: &Delivery,
    config: &Arc<Config>,
    url: String,
    alerts: Vec<serde_json::Value>,
    tries: u32,
) -> JoinHandle<()> {
    let http = delivery.http.clone();
    deliver(
        delivery,
        config,
        ("alertmanager", "alertmanager".into(), tries),
        move |timeout| {
            let (http, url, alerts) = (http.clone(), url.clone(), alerts.clone());
            async move { channels::alertmanager(&http, &url, &alerts, timeout).await }
        },
    )
}

/// Posts every announced firing alert again; the delivery, if any.
fn resend_firing(
    delivery: &Delivery,
    config: &Arc<Config>,
    state: &Ledger,
) -> Option<JoinHandle<()>> {
    let am = config.notify.alertmanager.as_ref()?;
    if state.firing.is_empty() {
        return None;
    }
    // Not those still waiting for their announcement: one that flaps back
    // within its window is never announced, nor ended.
    let announced = |f: &&Firing| {
        let v = &f.verdict;
        state
            .pending
            .get(&v.target)
            .is_none_or(|p| !p.firing.contains_key(&v.key()))
    };
    let group = Group {
        target: String::new(),
        status: Status::Firing,
        verdicts: state
            .firing
            .values()
            .filter(announced)
            .map(|f| f.verdict.clone())
            .collect(),
        began: BTreeMap::new(),
    };
    if group.verdicts.is_empty() {
        return None;
    }
    // Tried once: the next resend is its retry, with a fresh `endsAt`. A
    // retried payload could land minutes late, ending alerts whose
    // `endsAt` it had fixed, or firing one ended meanwhile.
    let alerts = alerts_for(config, &group, state, delivery.clock.now());
    Some(post_alerts_tried(
        delivery,
        config,
        am.url.clone(),
        alerts,
        1,
    ))
}

/// Delivers in the background with retries and exponential backoff;
/// the outcome is counted and logged, never returned.
fn deliver<F, Fut>(
    delivery: &Delivery,
    config: &Arc<Config>,
    (channel, name, max_attempts): (&'static str, String, u32),
    attempt: F,
) -> JoinHandle<()>
where
    F: Fn(Duration) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), channels::NotifyError>> + Send,
{
    let metrics = delivery.metrics.clone();
    let shutdown = delivery.shutdown.clone();
    let n = &config.notify;
    let (mut delay, timeout) = (n.retry_initial, n.timeout);
    tokio::spawn(async move {
        for n in 1..=max_attempts {
            match attempt(timeout).await {
                Ok(()) => {
                    metrics.sent(channel, &name);
                    return;
                }
                Err(e) if n < max_attempts => {
                    metrics.retried(channel, &name, n, delay, &e);
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.cancelled() => return,
                    }
                    delay = delay.saturating_mul(2).min(Duration::from_secs(300));
                }
                Err(e) => metrics.failed(channel, &name, n, &e),
            }
        }
    })
}

#[cfg(test)]
mod tests;
