//! The `/metrics` page: the families components register on it, in name
//! order, and the typed handles they write through. A write that moves a
//! series marks its family changed itself, so no writer can forget to, and
//! a family printed meanwhile is printed again at the next scrape.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::MetricsError;
use super::family::{Family, Kind};

/// The families every component registers, by name.
#[derive(Clone, Default)]
pub struct Page {
    families: Arc<Mutex<BTreeMap<String, Arc<Family>>>>,
}

impl Page {
    fn families(&self) -> Vec<Arc<Family>> {
        let families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        families.values().cloned().collect()
    }

    /// How many changes the page has seen: the sum of its families'.
    #[cfg(test)]
    pub fn generation(&self) -> u64 {
        self.families().iter().map(|f| f.changes()).sum()
    }

    /// Registers a family and gives the handle that writes to it.
    fn register<K>(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        kind: Kind,
    ) -> Result<Handle<K>, MetricsError> {
        let family = Arc::new(Family::new(name, help, labels, kind)?);
        let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        if families.contains_key(name) {
            return Err(MetricsError::Duplicate(name.to_owned()));
        }
        families.insert(name.to_owned(), family.clone());
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

    /// Removes every series labelled with `target`, in every family;
    /// returns how many.
    pub fn remove_target(&self, target: &str) -> usize {
        self.families()
            .iter()
            .map(|f| f.remove_of_target(target, &|_| true))
            .sum()
    }

    /// The text exposition of everything, families sorted by name, as the
    /// families' own texts: served one after another, so a scrape neither
    /// copies them nor holds the whole page (4 MB at 100 targets x 6
    /// scenarios) in one buffer. Each family keeps its last text and prints
    /// it again only after it changed: between runs only telemetry moves.
    pub fn encode_parts(&self) -> Vec<Bytes> {
        self.families()
            .iter()
            .map(|family| family.text())
            .filter(|text| !text.is_empty())
            .collect()
    }

    /// The whole page in one string.
    pub fn encode(&self) -> String {
        let parts = self.encode_parts();
        let mut page = String::with_capacity(parts.iter().map(Bytes::len).sum());
        for part in &parts {
            // Families print only UTF-8.
            page.push_str(&String::from_utf8_lossy(part));
        }
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

    /// Makes these the target's whole set of series in the family (its
    /// GPUs, its server info, the builds serving it): series it no longer
    /// has go, and nothing is marked changed when nothing moved.
    pub fn replace_target(&self, target: &str, rows: &[(&[&str], f64)]) {
        self.family.replace_target(target, rows);
    }
}

impl Counters {
    pub fn inc(&self, labels: &[&str]) {
        self.family.add(labels, 1.0);
    }

    pub fn inc_by(&self, labels: &[&str], by: u64) {
        self.family.add(labels, by as f64);
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let generation = page.generation();
        up.set(&["a"], 2.0);
        runs.declare(&["b"]);
        assert_eq!(page.generation(), generation, "nothing moved");
        assert_eq!(page.encode(), text);
        assert!(text.starts_with("# HELP t_runs_total h\n# TYPE t_runs_total counter\n"));
        assert!(text.contains("t_up{target=\"a\"} 2\n"), "{text}");
        up.remove(&["a"]);
        assert!(!page.encode().contains("t_up"), "removed");
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
    fn a_targets_series_are_replaced_as_a_whole_and_only_its_own() {
        let page = Page::default();
        let gpus = page.gauges("t_gpu", "h", &["target", "gpu"]).unwrap();
        gpus.replace_target("a", &[(&["a", "0"], 1.0), (&["a", "1"], 1.0)]);
        gpus.replace_target("a1", &[(&["a1", "0"], 1.0)]);
        gpus.replace_target("a", &[(&["a", "0"], 2.0)]);
        let text = page.encode();
        assert!(text.contains("t_gpu{gpu=\"0\",target=\"a\"} 2"), "{text}");
        assert!(!text.contains("t_gpu{gpu=\"1\",target=\"a\"}"), "{text}");
        assert!(text.contains("t_gpu{gpu=\"0\",target=\"a1\"} 1"), "{text}");
        let changes = gpus.family().changes();
        gpus.replace_target("a", &[(&["a", "0"], 2.0)]);
        assert_eq!(gpus.family().changes(), changes, "the same reading again");
        gpus.replace_target("a", &[]);
        assert!(!page.encode().contains("target=\"a\""));
    }
}
