use std::collections::HashMap;

use prometheus::{Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use super::*;

fn family(name: &str, labels: &[&str], kind: Kind) -> Family {
    Family::new(name, "what it holds", labels, kind).unwrap()
}

fn printed(f: &Family) -> String {
    String::from_utf8(f.text().to_vec()).unwrap()
}

/// The same series written to the prometheus crate's registry print the
/// same text: the format Prometheus and every test here already read.
#[test]
fn prints_what_the_prometheus_crate_prints() {
    let registry = Registry::new();
    let labels = ["target", "model", "gpu"];
    let theirs_g = GaugeVec::new(Opts::new("x_gauge", "a \\ help\nline"), &labels).unwrap();
    let theirs_c = IntCounterVec::new(Opts::new("x_total", "counts"), &["target"]).unwrap();
    let bounds = vec![0.005, 0.1, 1.0, 300.0];
    let theirs_h = HistogramVec::new(
        HistogramOpts::new("x_seconds", "latency").buckets(bounds.clone()),
        &["target"],
    )
    .unwrap();
    let theirs_plain = GaugeVec::new(Opts::new("x_plain", "no labels"), &[]).unwrap();
    registry.register(Box::new(theirs_g.clone())).unwrap();
    registry.register(Box::new(theirs_c.clone())).unwrap();
    registry.register(Box::new(theirs_h.clone())).unwrap();
    registry.register(Box::new(theirs_plain.clone())).unwrap();

    let ours_g = Family::new("x_gauge", "a \\ help\nline", &labels, Kind::Gauge).unwrap();
    let ours_c = Family::new("x_total", "counts", &["target"], Kind::Counter).unwrap();
    let ours_h = Family::new("x_seconds", "latency", &["target"], Kind::Histogram(bounds)).unwrap();
    let ours_plain = Family::new("x_plain", "no labels", &[], Kind::Gauge).unwrap();

    let gauges: [([&str; 3], f64); 6] = [
        (["a", "Qwen/Qwen3-0.6B", "0"], 0.123456789),
        (["b", "m", "1"], -2.5),
        (["c", "quote\" back\\slash\nnewline", "2"], 1e21),
        (["d", "m", "3"], f64::NAN),
        (["e", "m", "4"], f64::INFINITY),
        (["f", "m", "5"], 3.0),
    ];
    for (values, v) in gauges {
        theirs_g.with_label_values(&values).set(v);
        ours_g.set(&values, v);
    }
    for _ in 0..3 {
        theirs_c.with_label_values(&["a"]).inc();
        ours_c.add(&["a"], 1.0);
    }
    theirs_c.with_label_values(&["b"]);
    ours_c.declare(&["b"]);
    let observed = [0.001, 0.005, 0.05, 0.7, 2.0, 400.0];
    for v in observed {
        theirs_h.with_label_values(&["a"]).observe(v);
    }
    ours_h.observe_all(&["a"], observed);
    theirs_plain.with_label_values::<&str>(&[]).set(7.0);
    ours_plain.set(&[], 7.0);

    let mut theirs = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&registry.gather(), &mut theirs)
        .unwrap();
    // Families in name order, as the page prints them.
    let ours = [&ours_g, &ours_plain, &ours_h, &ours_c]
        .iter()
        .map(|f| printed(f))
        .collect::<String>();
    assert_eq!(ours, String::from_utf8(theirs).unwrap());
}

#[test]
fn a_family_is_printed_again_only_after_it_changed() {
    let f = family("x_up", &["target"], Kind::Gauge);
    assert_eq!(printed(&f), "", "no series: no header either");
    f.set(&["a"], 1.0);
    let first = printed(&f);
    let changes = f.changes();
    assert_eq!(printed(&f), first);
    assert_eq!(f.changes(), changes, "printing is not a change");
    f.set(&["a"], 2.0);
    assert!(printed(&f).contains("x_up{target=\"a\"} 2\n"));
    let changes = f.changes();
    f.set(&["a"], 2.0);
    f.declare(&["a"]);
    f.set(&["missing label", "too many"], 3.0);
    assert_eq!(f.changes(), changes, "writes that move nothing");
    f.remove(&["a"]);
    assert_eq!(printed(&f), "");
}

#[test]
fn removals_match_unescaped_labels_of_the_target_only() {
    let f = family("x_run", &["target", "build"], Kind::Gauge);
    f.set(&["t1", "0.32.0"], 1.0);
    f.set(&["t1", "odd \"build\"\\n"], 1.0);
    f.set(&["t10", "odd \"build\"\\n"], 1.0);
    let odd = |l: &HashMap<&str, &str>| l.get("build") == Some(&"odd \"build\"\\n");
    assert_eq!(f.remove_of_target("t1", &odd), 1);
    let text = printed(&f);
    assert!(text.contains("build=\"0.32.0\",target=\"t1\""), "{text}");
    assert!(text.contains("target=\"t10\""), "t10 is not t1: {text}");
    assert_eq!(f.remove_of_target("t1", &|_| false), 0);
    assert_eq!(f.remove_of_target("t10", &|_| true), 1);
}

#[test]
fn bad_definitions_are_refused_and_bad_writes_ignored() {
    let new = |name: &str, labels: &[&str], kind: Kind| Family::new(name, "h", labels, kind).err();
    assert!(matches!(
        new("1x", &[], Kind::Gauge),
        Some(MetricsError::Name(_))
    ));
    assert!(matches!(
        new("x-y", &[], Kind::Gauge),
        Some(MetricsError::Name(_))
    ));
    for labels in [&["a", "a"][..], &["__name"], &["a:b"], &[""]] {
        assert!(matches!(
            new("x", labels, Kind::Gauge),
            Some(MetricsError::Label(..))
        ));
    }
    let hist = Kind::Histogram(vec![1.0]);
    assert!(matches!(
        new("x", &["le"], hist),
        Some(MetricsError::Label(..))
    ));
    assert!(
        new("x", &["le"], Kind::Gauge).is_none(),
        "le is only a histogram's"
    );
    let f = family("x_g", &["a", "b"], Kind::Gauge);
    // A histogram write to a gauge, or a value for a missing label, is a
    // bug in the caller that leaves the family as it was.
    f.observe_all(&["1", "2"], [1.0]);
    assert_eq!(printed(&f), "");
}

#[test]
fn values_print_as_display_prints_them_or_as_exactly() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut values = vec![
        0.0, -0.0, 1.0, -3.0, 0.1, 1e-4, 9.9e-5, 1e15, 1e16, 1e21, 123.456,
    ];
    for _ in 0..20_000 {
        let bits = next();
        let mantissa = (bits >> 11) as f64 / (1u64 << 53) as f64;
        let exponent = (bits % 40) as i32 - 20;
        values.push(mantissa * 10f64.powi(exponent));
        values.push((bits % 1_000_000) as f64);
    }
    let mut ties = 0;
    for v in values {
        let mut ours = String::new();
        push_value(&mut ours, v);
        let display = v.to_string();
        if ours != display {
            // Two shortest decimals equally close: either reads back the
            // same number, in the same plain notation.
            assert_eq!(ours.parse::<f64>().unwrap(), v, "{ours} vs {display}");
            assert_eq!(ours.len(), display.len(), "{ours} vs {display}");
            ties += 1;
        }
    }
    assert!(ties < 100, "{ties} values print otherwise than Display");
}
