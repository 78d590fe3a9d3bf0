//! The output-drift canary: a build's greedy answers to a fixed prompt set
//! compared with another's, token by token. Per prompt, the first position
//! where the answers part and the mean absolute log-probability difference
//! over the tokens before it; the verdict `drift` when most prompts part
//! early or the log-probabilities moved past a threshold.

use serde::{Deserialize, Serialize};

pub use crate::config::verdict_policy::DriftThresholds;
pub use crate::vocabulary::answers::Answer;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptDrift {
    pub prompt: usize,
    /// The first token position where the answers differ; `None` when one
    /// answer is the other or starts it.
    pub first_divergence: Option<usize>,
    /// Over the tokens both answers share at the start.
    pub mean_abs_logprob_diff: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriftReport {
    /// The prompts both builds answered, compared.
    pub prompts: Vec<PromptDrift>,
    /// The candidate's answers, compared or not.
    #[serde(default)]
    pub answered: usize,
    /// Prompts whose answers differ anywhere, and before the position.
    pub diverged: usize,
    pub diverged_early: usize,
    pub position: usize,
    /// Mean over prompts of their mean absolute log-probability difference.
    pub logprob_shift: f64,
    pub drift: bool,
}

impl DriftReport {
    /// Whether any prompt was answered by both builds: with none, nothing
    /// was compared and the report cannot say "no drift".
    pub fn judged(&self) -> bool {
        !self.prompts.is_empty()
    }

    /// "0.33.0 answers differently: 7 of 8 prompts diverge before token 5".
    pub fn sentence(&self, build: &str) -> String {
        let n = self.prompts.len();
        if !self.judged() {
            format!(
                "{build} cannot be judged: none of its {} answers is to a prompt the other build answered (0 compared)",
                self.answered
            )
        } else if self.drift {
            format!(
                "{build} answers differently: {} of {n} prompts diverge before token {} ({} at all; mean log-probability shift {:.4})",
                self.diverged_early, self.position, self.diverged, self.logprob_shift
            )
        } else {
            format!(
                "{build} answers as before: {} of {n} prompts diverge at all, {} before token {} (mean log-probability shift {:.4})",
                self.diverged, self.diverged_early, self.position, self.logprob_shift
            )
        }
    }
}

/// Compares the candidate's answers with the reference's, prompt by
/// prompt (only prompts both answered).
pub fn compare(reference: &[Answer], candidate: &[Answer], t: &DriftThresholds) -> DriftReport {
    let prompts: Vec<PromptDrift> = candidate
        .iter()
        .filter_map(|c| {
            let r = reference.iter().find(|r| r.prompt == c.prompt)?;
            Some(compare_one(r, c))
        })
        .collect();
    let diverged = prompts
        .iter()
        .filter(|p| p.first_divergence.is_some())
        .count();
    let diverged_early = prompts
        .iter()
        .filter(|p| p.first_divergence.is_some_and(|d| d < t.position))
        .count();
    let logprob_shift = match prompts.len() {
        0 => 0.0,
        n => prompts.iter().map(|p| p.mean_abs_logprob_diff).sum::<f64>() / n as f64,
    };
    let drift = !prompts.is_empty()
        && (diverged_early as f64 >= t.share * prompts.len() as f64
            || logprob_shift > t.logprob_shift);
    DriftReport {
        prompts,
        answered: candidate.len(),
        diverged,
        diverged_early,
        position: t.position,
        logprob_shift,
        drift,
    }
}

fn compare_one(reference: &Answer, candidate: &Answer) -> PromptDrift {
    let common = reference
        .tokens
        .iter()
        .zip(&candidate.tokens)
        .take_while(|(a, b)| a == b)
        .count();
    let shorter = reference.tokens.len().min(candidate.tokens.len());
    let diffs: Vec<f64> = reference
        .logprobs
        .iter()
        .zip(&candidate.logprobs)
        .take(common)
        .map(|(a, b)| (a - b).abs())
        .filter(|d| d.is_finite())
        .collect();
    PromptDrift {
        prompt: candidate.prompt,
        first_divergence: (common < shorter).then_some(common),
        mean_abs_logprob_diff: match diffs.len() {
            0 => 0.0,
            n => diffs.iter().sum::<f64>() / n as f64,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(prompt: usize, tokens: &str, logprob: f64) -> Answer {
        let tokens: Vec<String> = tokens.split(' ').map(str::to_owned).collect();
        Answer {
            prompt,
            logprobs: vec![logprob; tokens.len()],
            tokens,
        }
    }

    #[test]
    fn identical_answers_do_not_drift() {
        let a: Vec<Answer> = (0..8).map(|i| answer(i, "a b c d e f", -0.5)).collect();
        let r = compare(&a, &a, &DriftThresholds::default());
        assert_eq!((r.diverged, r.diverged_early, r.drift), (0, 0, false));
        assert_eq!(r.logprob_shift, 0.0);
        assert!(
            r.sentence("0.32.0")
                .starts_with("0.32.0 answers as before: 0 of 8")
        );
    }

    #[test]
    fn nothing_compared_is_not_judged() {
        // Two builds behind a round-robin balancer answered disjoint
        // halves of the prompts: nothing to compare, so no "no drift".
        let old: Vec<Answer> = (0..4).map(|i| answer(2 * i, "a b", -0.5)).collect();
        let new: Vec<Answer> = (0..4).map(|i| answer(2 * i + 1, "a b", -0.5)).collect();
        let r = compare(&old, &new, &DriftThresholds::default());
        assert!(!r.judged() && !r.drift);
        assert_eq!(
            r.sentence("0.33.0"),
            "0.33.0 cannot be judged: none of its 4 answers is to a prompt the other build answered (0 compared)"
        );
    }

    #[test]
    fn most_prompts_parting_early_is_drift() {
        let old: Vec<Answer> = (0..8).map(|i| answer(i, "a b c d e f", -0.5)).collect();
        let mut new = old.clone();
        for a in new.iter_mut().take(7) {
            a.tokens[2] = "x".into();
        }
        let r = compare(&old, &new, &DriftThresholds::default());
        assert_eq!((r.diverged, r.diverged_early), (7, 7));
        assert_eq!(r.prompts[0].first_divergence, Some(2));
        assert_eq!(r.prompts[7].first_divergence, None);
        assert!(r.drift);
        assert_eq!(
            r.sentence("0.33.0"),
            "0.33.0 answers differently: 7 of 8 prompts diverge before token 5 (7 at all; mean log-probability shift 0.0000)"
        );
    }

    #[test]
    fn a_log_probability_shift_alone_is_drift() {
        let old: Vec<Answer> = (0..4).map(|i| answer(i, "a b c", -0.5)).collect();
        let new: Vec<Answer> = (0..4).map(|i| answer(i, "a b c", -0.502)).collect();
        let r = compare(&old, &new, &DriftThresholds::default());
        assert_eq!(r.diverged, 0);
        assert!((r.logprob_shift - 0.002).abs() < 1e-9);
        assert!(r.drift);
        let late: Vec<Answer> = (0..4).map(|i| answer(i, "a b c d e f g h", -0.5)).collect();
        let mut parted = late.clone();
        parted[0].tokens[6] = "z".into();
        let r = compare(&late, &parted, &DriftThresholds::default());
        assert_eq!((r.diverged, r.diverged_early, r.drift), (1, 0, false));
    }
}
