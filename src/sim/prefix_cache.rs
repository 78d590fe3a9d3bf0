//! The simulator's prefix cache: prompts split into blocks of 16 tokens
//! (words), each block known by the hash of everything up to its end, hits
//! counted up to the first block not seen before, as vLLM's automatic
//! prefix caching counts them. Bounded: the oldest blocks are forgotten.

use std::collections::{HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

const BLOCK_TOKENS: usize = 16;
const MAX_BLOCKS: usize = 16_384;

#[derive(Default)]
pub struct PrefixCache {
    known: HashSet<u64>,
    order: VecDeque<u64>,
}

impl PrefixCache {
    /// Looks the prompt's whole blocks up, remembers them, and returns the
    /// tokens found. Token 0 is the beginning-of-sequence token.
    pub fn lookup(&mut self, prompt: &str) -> u64 {
        let mut hasher = DefaultHasher::new();
        let mut hits = 0u64;
        let mut missed = false;
        let mut in_block = 1; // the beginning-of-sequence token
        for word in prompt.split_whitespace() {
            word.hash(&mut hasher);
            in_block += 1;
            if in_block < BLOCK_TOKENS {
                continue;
            }
            in_block = 0;
            let block = hasher.finish();
            if !missed && self.known.contains(&block) {
                hits += BLOCK_TOKENS as u64;
                continue;
            }
            missed = true;
            if self.known.insert(block) {
                self.order.push_back(block);
                if self.order.len() > MAX_BLOCKS
                    && let Some(old) = self.order.pop_front()
                {
                    self.known.remove(&old);
                }
            }
        }
        hits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_whole_blocks_hit_and_distinct_prompts_do_not() {
        let mut cache = PrefixCache::default();
        let prefix: String = (0..47).map(|i| format!("p{i} ")).collect();
        // 1 + 47 = 48 tokens: three whole blocks shared.
        assert_eq!(cache.lookup(&format!("{prefix} a b c")), 0);
        assert_eq!(cache.lookup(&format!("{prefix} d e f")), 48);
        assert_eq!(cache.lookup("x y z"), 0);
        let other: String = (0..47).map(|i| format!("q{i} ")).collect();
        assert_eq!(cache.lookup(&other), 0);
    }
}
