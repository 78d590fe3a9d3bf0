//! Prompt building: per-request lengths (with vLLM's range ratio), a
//! distinct random text per request so the prefix cache cannot flatter
//! TTFT, and calibration of each text to the requested token count through
//! the server's `/tokenize`.
//!
//! Calibration counts tokens the way `vllm bench serve`'s random dataset
//! does: the raw prompt text, special tokens included, whatever the
//! endpoint. On the chat endpoint the server then adds its template, and
//! the reported input length is `usage.prompt_tokens` as on the server.
//! Without `/tokenize` (not vLLM) the approximation is one token per word
//! of the built-in vocabulary of common short English words, plus one for a
//! beginning-of-sequence token; the real count is still read from `usage`.

use futures_util::{StreamExt, stream};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::client::server_api::{ServerApi, ServerError};
use crate::client::{Endpoint, PreparedRequest};

/// Common short English words: about one token each in the tokenizers of
/// popular models, which keeps the uncalibrated approximation close.
const WORDS: &[&str] = &[
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "model", "token", "latency",
    "server", "probe", "metric", "value", "alpha", "beta", "gamma", "delta", "river", "stone",
    "cloud", "light", "shadow", "north", "south", "east", "west", "number", "letter", "window",
    "garden", "kitchen", "music", "paper", "time", "year", "people", "way", "day", "man", "thing",
    "woman", "life", "child", "world", "school", "state", "family", "group", "country", "problem",
    "hand", "part", "place", "case", "week", "company", "system", "program", "question", "work",
    "night", "point", "home", "water", "room", "mother", "area", "money", "story", "fact", "month",
    "lot", "right", "study", "book", "eye", "job", "word", "business", "issue", "side", "kind",
    "head", "house", "service", "friend", "father", "power", "hour", "game", "line", "end",
    "member", "law", "car", "city", "name", "team",
];

/// Lengths for one run: uniform integers in `[floor(L(1-r)), ceil(L(1+r))]`
/// as vLLM's random dataset draws them (outputs at least 1).
pub fn sample_lengths(
    rng: &mut StdRng,
    count: usize,
    len: u32,
    range_ratio: f64,
    min: u32,
) -> Vec<u32> {
    let low = ((f64::from(len) * (1.0 - range_ratio)).floor() as u32).max(min);
    let high = ((f64::from(len) * (1.0 + range_ratio)).ceil() as u32).max(low);
    (0..count).map(|_| rng.random_range(low..=high)).collect()
}

/// What to build.
#[derive(Debug, Clone)]
pub struct PromptPlan {
    pub run_id: String,
    pub seed: u64,
    pub count: usize,
    pub input_len: u32,
    pub output_len: u32,
    pub range_ratio: f64,
    /// Index offset so warm-up and measured requests get distinct ids.
    pub first_index: usize,
}

/// The prepared requests and whether their lengths were calibrated.
#[derive(Debug, Clone)]
pub struct PromptSet {
    pub requests: Vec<PreparedRequest>,
    pub calibrated: bool,
}

/// Words of one request: its own RNG stream, so texts differ from the
/// first word on.
fn words_for(seed: u64, index: usize, n: usize) -> String {
    let mut rng = StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut text = String::with_capacity(n * 7);
    for i in 0..n {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    text
}

/// Builds the requests. With `api` the texts are calibrated through
/// `/tokenize` (a few calls per request, at most `parallel` at once, before
/// any timing starts); without it, or when the server has no `/tokenize`,
/// the word-count approximation is used.
pub async fn build(
    plan: &PromptPlan,
    api: Option<(&ServerApi, &str)>,
    parallel: usize,
) -> Result<PromptSet, ServerError> {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let inputs = sample_lengths(&mut rng, plan.count, plan.input_len, plan.range_ratio, 1);
    let outputs = sample_lengths(&mut rng, plan.count, plan.output_len, plan.range_ratio, 1);
    let text_seed: u64 = rng.random();

    let calibrated = match api {
        Some((api, model)) => match api
            .count_tokens(model, Endpoint::Completions, "the")
            .await?
        {
            None => false,
            // One common word is a token or a few in any tokenizer (plus
            // special tokens); anything else cannot calibrate a prompt.
            Some(n) if (1..=MAX_TOKENS_PER_WORD + SPECIAL_TOKENS).contains(&n) => true,
            Some(n) => {
                return Err(nonsense(
                    api,
                    format!("the word \"the\" counted as {n} tokens"),
                ));
            }
        },
        None => false,
    };
    let texts: Vec<String> = if calibrated {
        let (api, model) = api.expect("calibrated implies an API");
        let first_index = plan.first_index;
        // Owned items: a future borrowing the iterator's items would not be
        // `Send` for every lifetime, which spawned daemon tasks require.
        let jobs: Vec<_> = inputs
            .iter()
            .copied()
            .enumerate()
            .map(|(i, target)| calibrate(api, model, text_seed, first_index + i, target))
            .collect();
        stream::iter(jobs)
            .buffered(parallel.max(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()?
    } else {
        inputs
            .iter()
            .enumerate()
            .map(|(i, &target)| {
                words_for(
                    text_seed,
                    plan.first_index + i,
                    target.saturating_sub(1).max(1) as usize,
                )
            })
            .collect()
    };
    let requests = texts
        .into_iter()
        .zip(outputs)
        .enumerate()
        .map(|(i, (prompt, max_tokens))| PreparedRequest {
            index: i,
            request_id: format!("sentinel-{}-{}", plan.run_id, plan.first_index + i),
            prompt,
            messages: None,
            max_tokens,
            turn: None,
        })
        .collect();
    Ok(PromptSet {
        requests,
        calibrated,
    })
}

/// The text of a shared prefix of `tokens` tokens from its own word
/// stream: calibrated through `/tokenize` when the server has it (counted
/// with the beginning-of-sequence token, as the requests behind it are).
pub async fn shared_prefix(
    api: Option<(&ServerApi, &str)>,
    seed: u64,
    tokens: u32,
) -> Result<String, ServerError> {
    // Its own stream: no request's text starts like the prefix.
    const PREFIX_STREAM: usize = usize::MAX;
    if let Some((api, model)) = api
        && api
            .count_tokens(model, Endpoint::Completions, "the")
            .await?
            .is_some()
    {
        return calibrate(api, model, seed, PREFIX_STREAM, tokens + 1).await;
    }
    Ok(words_for(seed, PREFIX_STREAM, tokens as usize))
}

/// Puts `prefix` in front of every request: before the prompt, or before
/// the first message of a conversation (a later turn carries it in the
/// history already).
pub fn put_prefix(requests: &mut [PreparedRequest], prefix: &str) {
    let joined = |text: &str| format!("{prefix} {text}");
    for request in requests
        .iter_mut()
        .filter(|r| r.turn.is_none_or(|t| t == 1))
    {
        match request.messages.as_mut().and_then(|m| m.first_mut()) {
            Some(first) => first.content = joined(&first.content),
            None => request.prompt = joined(&request.prompt),
        }
    }
}

/// Most tokens one word of the built-in list can plausibly be: a
/// character-level tokenizer spends one per letter and one for the space.
const MAX_TOKENS_PER_WORD: u32 = 16;
/// Special tokens a tokenizer may add to any text (BOS, EOS, template).
const SPECIAL_TOKENS: u32 = 64;
/// Rounds of counting per request.
const MAX_ROUNDS: usize = 12;
/// Most words tried for a prompt of `target` tokens: every tokenizer gives
/// at least one token per word of the list, so four times the target is
/// far past any answer, and bounds the text whatever the server says.
fn max_words(target: u32) -> u32 {
    target.saturating_mul(4).max(8)
}

fn nonsense(api: &ServerApi, detail: String) -> ServerError {
    ServerError::Tokenize {
        url: format!("{}/tokenize", api.base_url()),
        detail,
    }
}

/// Whether `n` tokens for `words` words of the list is a count a real
/// tokenizer could give: at least a quarter token per word, at most
/// [`MAX_TOKENS_PER_WORD`] per word plus special tokens.
fn plausible(words: u32, n: u32) -> bool {
    let words = u64::from(words);
    let n = u64::from(n);
    n >= 1
        && n * 4 >= words
        && n <= words * u64::from(MAX_TOKENS_PER_WORD) + u64::from(SPECIAL_TOKENS)
}

/// Finds the text of this request's word stream that the server counts as
/// `target` tokens: a bracketing search over the word count (secant guesses
/// from the tokens-per-word seen so far), then filler words to close a gap
/// smaller than one word. Falls back to the closest count below the target.
/// Bounded whatever the server answers: at most [`MAX_ROUNDS`] counts, at
/// most [`max_words`] words, and a count no tokenizer could give is an error.
async fn calibrate(
    api: &ServerApi,
    model: &str,
    seed: u64,
    index: usize,
    target: u32,
) -> Result<String, ServerError> {
    let count = |text: String, words: u32| async move {
        let n = api
            .count_tokens(model, Endpoint::Completions, &text)
            .await?
            .unwrap_or(0);
        if !plausible(words, n) {
            return Err(nonsense(
                api,
                format!("{words} words counted as {n} tokens"),
            ));
        }
        Ok::<_, ServerError>((text, n))
    };
    let ceiling = max_words(target);
    // Largest word count known to fit, and smallest known to overshoot.
    let mut fits: Option<(u32, String, u32)> = None;
    let mut over: Option<u32> = None;
    let mut words = target.saturating_sub(1).clamp(1, ceiling);
    for _ in 0..MAX_ROUNDS {
        let (text, n) = count(words_for(seed, index, words as usize), words).await?;
        if n == target {
            return Ok(text);
        }
        if n < target {
            if fits.as_ref().is_none_or(|(w, _, _)| words > *w) {
                fits = Some((words, text, n));
            }
        } else if over.is_none_or(|o| words < o) {
            over = Some(words);
        }
        let low = fits.as_ref().map_or(0, |(w, _, _)| *w);
        let high = over.unwrap_or(ceiling + 1);
        if high.saturating_sub(low) <= 1 {
            break;
        }
        let per_word = f64::from(n.max(1)) / f64::from(words);
        let guess = (f64::from(target) / per_word)
            .round()
            .min(f64::from(ceiling)) as u32;
        words = guess.clamp(low + 1, high.saturating_sub(1).max(low + 1));
    }
    let Some((words, text, n)) = fits else {
        return Ok(words_for(seed, index, 1));
    };
    // Close the last gap with a common word that is one token almost
    // everywhere; never more words than the ceiling allows.
    let filler = (target - n).min(ceiling.saturating_sub(words));
    let padded = format!("{text}{}", " the".repeat(filler as usize));
    let (padded, padded_n) = count(padded, words + filler).await?;
    Ok(if padded_n == target { padded } else { text })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_stay_in_vllms_range() {
        let mut rng = StdRng::seed_from_u64(1);
        let lens = sample_lengths(&mut rng, 2000, 100, 0.5, 1);
        assert!(lens.iter().all(|&l| (50..=150).contains(&l)));
        assert_eq!(*lens.iter().min().unwrap(), 50);
        assert_eq!(*lens.iter().max().unwrap(), 150);
        let fixed = sample_lengths(&mut rng, 10, 64, 0.0, 1);
        assert!(fixed.iter().all(|&l| l == 64));
        assert!(
            sample_lengths(&mut rng, 10, 1, 0.9, 1)
                .iter()
                .all(|&l| l >= 1)
        );
    }

    #[test]
    fn texts_are_distinct_from_the_first_words() {
        let a = words_for(7, 0, 8);
        let b = words_for(7, 1, 8);
        assert_ne!(
            a.split(' ').take(4).collect::<Vec<_>>(),
            b.split(' ').take(4).collect::<Vec<_>>()
        );
        assert_eq!(a, words_for(7, 0, 8));
        assert_eq!(a.split(' ').count(), 8);
    }

    #[test]
    fn a_prefix_goes_before_a_conversations_first_turn_only() {
        let request = |turn| PreparedRequest {
            prompt: "text".into(),
            turn,
            ..Default::default()
        };
        let mut requests = [request(None), request(Some(1)), request(Some(2))];
        put_prefix(&mut requests, "shared");
        let prompts: Vec<&str> = requests.iter().map(|r| r.prompt.as_str()).collect();
        assert_eq!(prompts, ["shared text", "shared text", "text"]);
    }

    #[test]
    fn only_counts_a_tokenizer_could_give_are_plausible() {
        assert!(plausible(127, 128));
        assert!(plausible(127, 127 * 5));
        assert!(plausible(1, 3));
        assert!(!plausible(127, 0));
        assert!(!plausible(127, 1), "a constant count of 1");
        assert!(!plausible(127, u32::MAX));
        assert_eq!(max_words(128), 512);
    }
}
