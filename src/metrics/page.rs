//! The `/metrics` page: the families components register on it, in name
//! order, and the typed handles they write through. Every write through a
//! handle marks its family and the page changed itself, after the write,
//! so no writer can forget to, and a family printed meanwhile is printed
//! again at the next scrape.

use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::MetricsError;
use super::family::{Family, Kind};

/// The families every component registers, by name, and the page-wide
/// change counter.
#[derive(Clone)]
pub struct Page {
    families: Arc<Mutex<BTreeMap<String, Arc<Family>>>>,
    /// Every change, made through a handle.
    changes: Arc<AtomicU64>,
    /// The last page's length: the next one is about as long.
    last_len: Arc<AtomicUsize>,
}

impl Default for Page {
    fn default() -> Self {
        Page {
            families: Arc::default(),
            changes: Arc::new(AtomicU64::new(1)),
            last_len: Arc::default(),
        }
    }
}

impl Page {
    /// How many changes the page has seen.
    pub fn generation(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Registers a family and gives the handle that writes to it.
    fn register<K>(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        kind: Kind,
    ) -> Result<Handle<K>, MetricsError> {
        let family = Arc::new(Family::new(name, help, labels, kind, self.changes.clone())?);
        let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        if families.contains_key(name) {
            return Err(MetricsError::Duplicate(name.to_owned()));
        }
        families.insert(name.to_owned(), family.clone());
        self.changes.fetch_add(1, Ordering::Release);
        Ok(Handle {
            family,
            kind: PhantomData,
        })
    }

    pub fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> Result<Gauges, MetricsError> {
        self.register(name, help, labels, Kind::Gauge)
    }

    pub fn counters(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<Counters, MetricsError> {
        self.register(name, help, labels, Kind::Counter)
    }

    pub fn histograms(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: Vec<f64>,
    ) -> Result<Histograms, MetricsError> {
        let increasing = buckets.windows(2).all(|w| w[0] < w[1]);
        if buckets.is_empty() || !increasing || buckets.iter().any(|b| !b.is_finite()) {
            return Err(MetricsError::Buckets(name.to_owned()));
        }
        self.register(name, help, labels, Kind::Histogram(buckets))
    }

    /// The text exposition of everything, families sorted by name. Each
    /// family keeps its last text and prints it again only after it
    /// changed: between runs only telemetry moves.
    pub fn encode(&self) -> String {
        let families: Vec<Arc<Family>> = self
            .families
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut page = String::with_capacity(self.last_len.load(Ordering::Relaxed) + 4096);
        for family in families {
            family.print_into(&mut page);
        }
        self.last_len.store(page.len(), Ordering::Relaxed);
        page
    }
}

/// What a handle writes: the kinds of family.
pub struct Gauge;
pub struct Counter;
pub struct Histogram;

/// A registered family, typed by what it holds.
pub struct Handle<K> {
    family: Arc<Family>,
    kind: PhantomData<K>,
}

impl<K> Clone for Handle<K> {
    fn clone(&self) -> Self {
        Handle {
            family: self.family.clone(),
            kind: PhantomData,
        }
    }
}

pub type Gauges = Handle<Gauge>;
pub type Counters = Handle<Counter>;
pub type Histograms = Handle<Histogram>;

impl<K> Handle<K> {
    /// The family itself, for removers that match on labels.
    pub fn family(&self) -> &Arc<Family> {
        &self.family
    }

    /// Removes one series; absent is fine.
    pub fn remove(&self, labels: &[&str]) {
        self.family.remove(labels);
    }

    /// Removes the series with exactly these labels, named; absent is fine.
    pub fn remove_labels(&self, labels: &HashMap<&str, &str>) {
        self.family.remove_named(labels);
    }

    /// Removes every series of the family.
    pub fn reset(&self) {
        self.family.reset();
    }
}

impl Gauges {
    pub fn set(&self, labels: &[&str], value: f64) {
        self.family.set(labels, value);
    }

    /// Creates the series at 0 if it does not exist; keeps its value if
    /// it does.
    pub fn declare(&self, labels: &[&str]) {
        self.family.declare(labels);
    }
}

impl Counters {
    pub fn inc(&self, labels: &[&str]) {
        self.family.add(labels, 1.0);
    }

    /// Creates the series at 0 if it does not exist, so rates and
    /// dashboards have it before the first event.
    pub fn declare(&self, labels: &[&str]) {
        self.family.declare(labels);
    }
}

impl Histograms {
    /// Observes every value into one series, marking the page once.
    pub fn observe_all(&self, labels: &[&str], values: impl IntoIterator<Item = f64>) {
        self.family.observe_all(labels, values);
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

    #[test]
    fn only_families_that_changed_are_printed_again() {
        let page = Page::default();
        let up = page.gauges("t_up", "h", &["target"]).unwrap();
        let runs = page.counters("t_runs_total", "h", &["target"]).unwrap();
        let _empty = page.gauges("t_empty", "h", &["target"]).unwrap();
        assert_eq!(page.encode(), "", "no series, no headers");
        up.set(&["a"], 1.0);
        runs.inc(&["b"]);
        let before = runs.family().changes();
        up.set(&["a"], 2.0);
        assert_eq!(runs.family().changes(), before, "another family's write");
        let text = page.encode();
        assert!(text.starts_with("# HELP t_runs_total h\n# TYPE t_runs_total counter\n"));
        assert!(text.contains("t_up{target=\"a\"} 2\n"), "{text}");
        up.remove_labels(&HashMap::from([("target", "a")]));
        assert!(!page.encode().contains("t_up"), "removed by name");
        let late = page.gauges("t_late", "h", &["target"]).unwrap();
        late.set(&["z"], 3.0);
        assert!(
            page.encode().contains("t_late{target=\"z\"} 3"),
            "registered late"
        );
        assert!(matches!(
            page.gauges("t_up", "h", &["target"]),
            Err(MetricsError::Duplicate(_))
        ));
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
