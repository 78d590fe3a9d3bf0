//! The `[cluster]` section: which share of the configured targets this
//! instance probes and judges (`shard = "i/N"`, or `--shard i/N`), so
//! several instances over one configuration split the targets between them
//! with each probed by exactly one.

use std::fmt;
use std::hash::Hasher;
use std::str::FromStr;

use super::reader::{Errors, Fields};

/// Most instances one configuration may be split over.
const MAX_SHARDS: u32 = 1024;

/// Instance `index` of `count` (0-based, as a StatefulSet's ordinals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// Whether the target named `target` falls in this share. FNV-1a of
    /// the name: stable across builds, platforms and restarts (the
    /// standard library's hasher promises none of these), so a target
    /// stays with its instance and its baselines in that instance's store.
    pub fn owns(&self, target: &str) -> bool {
        let mut hasher = fnv::FnvHasher::default();
        hasher.write(target.as_bytes());
        hasher.finish() % u64::from(self.count) == u64::from(self.index)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(text: &str) -> Result<Shard, String> {
        let usage = || format!("{text:?} is not \"i/N\" (instance i of N, counted from 0)");
        let (index, count) = text.trim().split_once('/').ok_or_else(usage)?;
        let index: u32 = index.trim().parse().map_err(|_| usage())?;
        let count: u32 = count.trim().parse().map_err(|_| usage())?;
        if count == 0 || count > MAX_SHARDS {
            return Err(format!("{text:?}: N must be 1 to {MAX_SHARDS}"));
        }
        if index >= count {
            return Err(format!(
                "{text:?}: i counts from 0, so it must be below N ({count})"
            ));
        }
        Ok(Shard { index, count })
    }
}

#[derive(Debug, Clone, Default)]
pub struct ClusterConfig {
    /// This instance's share, from the file or `--shard`.
    pub shard: Option<Shard>,
    /// The share given on the command line: it outlives reloads, which
    /// would otherwise take the file's.
    pub pinned: Option<Shard>,
    /// Targets of the file left to the other instances.
    pub others: usize,
}

pub fn cluster(root: &mut Fields, errors: &mut Errors) -> ClusterConfig {
    let mut c = ClusterConfig::default();
    let Some(mut f) = root.table("cluster", errors) else {
        return c;
    };
    c.shard = f.parsed("shard", errors);
    f.finish(errors);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_parse_and_refuse_with_the_reason() {
        assert_eq!("1/3".parse(), Ok(Shard { index: 1, count: 3 }));
        assert_eq!(" 0 / 1 ".parse(), Ok(Shard { index: 0, count: 1 }));
        for (bad, says) in [
            ("3/3", "below N"),
            ("1/0", "N must be"),
            ("a/2", "is not"),
            ("2", "is not"),
            ("-1/2", "is not"),
        ] {
            let err = bad.parse::<Shard>().unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn every_target_has_exactly_one_owner_and_the_split_is_even() {
        let names: Vec<String> = (0..3000).map(|i| format!("vllm-{i}")).collect();
        let count = 3;
        let shards: Vec<Shard> = (0..count).map(|index| Shard { index, count }).collect();
        let mut sizes = vec![0usize; shards.len()];
        for name in &names {
            let owners: Vec<usize> = (0..shards.len())
                .filter(|&i| shards[i].owns(name))
                .collect();
            assert_eq!(owners.len(), 1, "{name}: {owners:?}");
            sizes[owners[0]] += 1;
        }
        assert!(
            sizes.iter().all(|&n| (900..=1100).contains(&n)),
            "{sizes:?}"
        );
    }

    #[test]
    fn the_owner_of_a_name_never_changes() {
        // Pinned values: a change of hash would move targets between
        // instances and away from their stores.
        let shard = |index| Shard { index, count: 4 };
        let owner = |name: &str| (0..4).find(|&i| shard(i).owns(name)).unwrap();
        let names = ["vllm", "b", "c", "d", "mixtral"];
        assert_eq!(names.map(owner), [0, 1, 2, 3, 2]);
    }
}
