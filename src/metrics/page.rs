//! The registry and its encoded `/metrics` page, and the family handles
//! components write through. Every write through a handle marks the page
//! changed itself, after the write, so no writer can forget to, and a page
//! encoded meanwhile is replaced at the next scrape.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

use super::MetricsError;

/// The registry every component registers on, with the page cache.
#[derive(Clone)]
pub struct Page {
    registry: Registry,
    /// Every change, made through a handle.
    changes: Arc<AtomicU64>,
    encoded: Arc<Mutex<Encoded>>,
}

/// The page as last encoded, and each family's own part of it.
#[derive(Default)]
struct Encoded {
    generation: u64,
    page: String,
    /// By family name, so the page comes out sorted as `gather` sorts it.
    families: std::collections::BTreeMap<String, FamilyText>,
}

/// One family: its change counter and its text as of `key`.
struct FamilyText {
    collector: Box<dyn Collector>,
    changes: Arc<AtomicU64>,
    /// The family's changes when `text` was made.
    key: u64,
    text: String,
}

impl Default for Page {
    fn default() -> Self {
        Page {
            registry: Registry::new(),
            changes: Arc::new(AtomicU64::new(1)),
            encoded: Arc::default(),
        }
    }
}

impl Page {
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// How many changes the page has seen.
    pub fn generation(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Registers `family` and gives the handle that writes to it, with the
    /// family's own change counter the encoder reads.
    fn register<T: Collector + Clone + 'static>(
        &self,
        family: T,
    ) -> Result<Handle<T>, MetricsError> {
        self.registry.register(Box::new(family.clone()))?;
        let own = Arc::new(AtomicU64::new(1));
        let name = family
            .desc()
            .first()
            .map(|d| d.fq_name.clone())
            .unwrap_or_default();
        let text = FamilyText {
            collector: Box::new(family.clone()),
            changes: own.clone(),
            key: 0,
            text: String::new(),
        };
        let mut encoded = self.encoded.lock().unwrap_or_else(|p| p.into_inner());
        encoded.families.insert(name, text);
        self.changes.fetch_add(1, Ordering::Release);
        Ok(Handle {
            family,
            changes: self.changes.clone(),
            own,
        })
    }

    pub fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> Result<Gauges, MetricsError> {
        self.register(GaugeVec::new(Opts::new(name, help), labels)?)
    }

    pub fn counters(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<Counters, MetricsError> {
        self.register(IntCounterVec::new(Opts::new(name, help), labels)?)
    }

    pub fn histograms(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: Vec<f64>,
    ) -> Result<Histograms, MetricsError> {
        let opts = HistogramOpts::new(name, help).buckets(buckets);
        self.register(HistogramVec::new(opts, labels)?)
    }

    /// The text exposition of everything. Between runs little changes:
    /// the page is encoded again only after a change, and then only the
    /// families that changed (telemetry gauges, typically, not the run
    /// histograms and statistics).
    pub fn encode(&self) -> String {
        let now = self.generation();
        let mut encoded = self.encoded.lock().unwrap_or_else(|p| p.into_inner());
        if encoded.generation == now {
            return encoded.page.clone();
        }
        let mut page = String::with_capacity(encoded.page.len());
        for family in encoded.families.values_mut() {
            let key = family.changes.load(Ordering::Acquire);
            if family.key != key {
                family.key = key;
                family.text = encode_family(family.collector.as_ref());
            }
            page.push_str(&family.text);
        }
        encoded.generation = now;
        encoded.page = page.clone();
        page
    }
}

/// One family's text; empty when it has no series (as `gather` leaves it
/// out). Encoding into a String cannot fail on I/O; a failure would be a
/// family the encoder rejects, which registration prevents.
fn encode_family(collector: &dyn Collector) -> String {
    let families: Vec<_> = collector
        .collect()
        .into_iter()
        .filter(|f| !f.get_metric().is_empty())
        .collect();
    let mut out = Vec::new();
    TextEncoder::new().encode(&families, &mut out).ok();
    String::from_utf8(out).unwrap_or_default()
}

/// A registered family and the page's change counter.
#[derive(Clone)]
pub struct Handle<F> {
    family: F,
    changes: Arc<AtomicU64>,
    /// This family's own changes: what tells the page to encode it again.
    own: Arc<AtomicU64>,
}

pub type Gauges = Handle<GaugeVec>;
pub type Counters = Handle<IntCounterVec>;
pub type Histograms = Handle<HistogramVec>;

impl<T: MetricVecBuilder> Handle<MetricVec<T>> {
    /// The family itself, for removers that match on labels.
    pub fn family(&self) -> &MetricVec<T> {
        &self.family
    }

    fn changed(&self) {
        // The family first: a page encoded between the two sees the
        // family changed and only misses the page-wide mark, which the
        // next scrape then catches.
        self.own.fetch_add(1, Ordering::Release);
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// Removes one series; absent is fine.
    pub fn remove(&self, labels: &[&str]) {
        if self.family.remove_label_values(labels).is_ok() {
            self.changed();
        }
    }

    /// Removes the series with exactly these labels, named; absent is fine.
    pub fn remove_labels(&self, labels: &HashMap<&str, &str>) {
        if self.family.remove(labels).is_ok() {
            self.changed();
        }
    }

    /// Removes every series of the family.
    pub fn reset(&self) {
        self.family.reset();
        self.changed();
    }
}

impl Gauges {
    pub fn set(&self, labels: &[&str], value: f64) {
        self.family.with_label_values(labels).set(value);
        self.changed();
    }

    /// Creates the series at 0 if it does not exist; keeps its value if
    /// it does.
    pub fn declare(&self, labels: &[&str]) {
        self.family.with_label_values(labels);
        self.changed();
    }
}

impl Counters {
    pub fn inc(&self, labels: &[&str]) {
        self.family.with_label_values(labels).inc();
        self.changed();
    }

    /// Creates the series at 0 if it does not exist, so rates and
    /// dashboards have it before the first event.
    pub fn declare(&self, labels: &[&str]) {
        self.family.with_label_values(labels);
        self.changed();
    }
}

impl Histograms {
    /// Observes every value into one series, marking the page once.
    pub fn observe_all(&self, labels: &[&str], values: impl IntoIterator<Item = f64>) {
        let series = self.family.with_label_values(labels);
        for v in values {
            series.observe(v);
        }
        self.changed();
    }
}

/// A gauge family whose series are replaced per target as a whole (the
/// GPUs of a target, its server info): the label sets set for a target
/// are remembered so the next reading removes those it no longer has.
pub struct TargetSeries {
    gauges: Gauges,
    set: Mutex<HashMap<String, Vec<Vec<String>>>>,
}

impl TargetSeries {
    pub fn new(gauges: Gauges) -> Self {
        TargetSeries {
            gauges,
            set: Mutex::default(),
        }
    }

    pub fn gauges(&self) -> &Gauges {
        &self.gauges
    }

    /// Removes every series set for `target` (the first label).
    pub fn clear(&self, target: &str) {
        let old = self
            .set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(target)
            .unwrap_or_default();
        for labels in old {
            self.gauges
                .remove(&labels.iter().map(String::as_str).collect::<Vec<_>>());
        }
    }

    /// Sets one series of the target named by `labels[0]`, remembered for
    /// the next [`TargetSeries::clear`].
    pub fn add(&self, labels: &[&str], value: f64) {
        self.gauges.set(labels, value);
        self.set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(labels[0].to_owned())
            .or_default()
            .push(labels.iter().map(|s| s.to_string()).collect());
    }

    /// Forgets every series of every target.
    pub fn reset(&self) {
        self.gauges.reset();
        self.set.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Per-target memory of the last value written, so telemetry that did not
/// move does not throw the encoded page away every scrape interval.
pub struct LastWritten<T>(Mutex<HashMap<String, T>>);

impl<T> Default for LastWritten<T> {
    fn default() -> Self {
        LastWritten(Mutex::default())
    }
}

impl<T: PartialEq> LastWritten<T> {
    /// Whether `value` differs from the last one for `target` (and records it).
    pub fn differs(&self, target: &str, value: T) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if seen.get(target) == Some(&value) {
            return false;
        }
        seen.insert(target.to_owned(), value);
        true
    }

    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_through_handles_replace_the_cached_page() {
        let page = Page::default();
        let up = page.gauges("t_up", "h", &["target"]).unwrap();
        let runs = page.counters("t_runs_total", "h", &["target"]).unwrap();
        up.set(&["a"], 1.0);
        let first = page.encode();
        assert!(first.contains("t_up{target=\"a\"} 1"));
        let generation = page.generation();
        assert_eq!(page.encode(), first, "unchanged: the cached page");
        assert_eq!(page.generation(), generation);
        runs.inc(&["a"]);
        assert!(page.encode().contains("t_runs_total{target=\"a\"} 1"));
        up.remove(&["a"]);
        assert!(!page.encode().contains("t_up{"));
    }

    /// The page as the registry would encode it whole.
    fn whole(page: &Page) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&page.registry().gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_page_encoded_by_family_is_the_whole_encoding() {
        let page = Page::default();
        let up = page.gauges("t_up", "h", &["target"]).unwrap();
        let runs = page.counters("t_runs_total", "h", &["target"]).unwrap();
        let lat = page
            .histograms("t_lat_seconds", "h", &["target"], vec![0.1, 1.0])
            .unwrap();
        let _empty = page.gauges("t_empty", "h", &["target"]).unwrap();
        assert_eq!(page.encode(), whole(&page), "nothing set");
        up.set(&["a"], 1.0);
        lat.observe_all(&["a"], [0.05, 0.5]);
        assert_eq!(page.encode(), whole(&page));
        runs.inc(&["b"]);
        assert_eq!(page.encode(), whole(&page), "one family moved");
        let named = HashMap::from([("target", "a")]);
        up.remove_labels(&named);
        assert_eq!(page.encode(), whole(&page), "after a removal by name");
        assert!(!page.encode().contains("t_up{"));
        let late = page.gauges("t_late", "h", &["target"]).unwrap();
        late.set(&["z"], 3.0);
        assert_eq!(page.encode(), whole(&page), "a family registered late");
    }

    #[test]
    fn target_series_replace_only_their_target() {
        let page = Page::default();
        let gpus = TargetSeries::new(page.gauges("t_gpu", "h", &["target", "gpu"]).unwrap());
        gpus.add(&["a", "0"], 1.0);
        gpus.add(&["a", "1"], 1.0);
        gpus.add(&["b", "0"], 1.0);
        gpus.clear("a");
        gpus.add(&["a", "0"], 2.0);
        let text = page.encode();
        assert!(text.contains("t_gpu{gpu=\"0\",target=\"a\"} 2"), "{text}");
        assert!(!text.contains("t_gpu{gpu=\"1\",target=\"a\"}"), "{text}");
        assert!(text.contains("t_gpu{gpu=\"0\",target=\"b\"} 1"), "{text}");
    }
}
