//! Text that came from a server (or a user) on its way into our logs,
//! store, pages and labels: bounded in length, free of control characters,
//! and with every secret we hold replaced by `[redacted]`.
//!
//! Servers are not trusted: a `/version` with a newline and ANSI codes can
//! forge a log line, a 401 body can echo the key it refused, and a model
//! list can be megabytes long. Everything a server says passes through
//! [`clean`] before it is kept.

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Longest identifier kept from a server: versions, model ids, fingerprints.
pub const MAX_ID_LEN: usize = 256;

/// Longest message kept from a server: error bodies, stream errors.
pub const MAX_MESSAGE_LEN: usize = 300;

/// At most `max` bytes of `text` (cut at a character boundary), with `…`
/// appended when something was cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// An identifier from a server, cleaned like [`clean`]; one longer than
/// `max` keeps its start and ends with a hash of the whole text, so two
/// identifiers that differ only past the cut stay two identifiers.
pub fn clean_identifier(text: &str, max: usize) -> String {
    let cleaned = clean(text, max);
    if !cleaned.ends_with('…') {
        return cleaned;
    }
    use std::hash::Hasher;
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(text.as_bytes());
    // 16 hex digits and the `~` before them.
    let head = truncate(&cleaned, max.saturating_sub(17 + '…'.len_utf8()));
    format!("{head}~{:016x}", hasher.finish())
}

/// Control characters (newlines, escapes, NUL, bidi overrides) become a
/// space, runs of whitespace collapse to one, and the result is bounded.
/// What is left can go on one log line, into a label or onto a page.
pub fn clean(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max + 4));
    let mut last_space = true;
    for c in text.chars() {
        let c = if c.is_control() || is_format_override(c) || c.is_whitespace() {
            ' '
        } else {
            c
        };
        if c == ' ' {
            if last_space {
                continue;
            }
            last_space = true;
        } else {
            last_space = false;
        }
        out.push(c);
        // Stop copying long before a hostile megabyte is walked to the end.
        if out.len() > max + 4 {
            break;
        }
    }
    let trimmed = out.trim_end();
    truncate(trimmed, max)
}

/// `text` bounded and quoted for a log line or an error message, with
/// every control, bidi and other invisible character escaped (`\n`,
/// `\u{202e}`) rather than blanked: the reader sees what was written,
/// and nothing in it can forge a line or reorder the text around it.
pub fn quoted(text: &str, max: usize) -> String {
    // Debug escapes every character Rust does not count as printable,
    // which takes in the bidi overrides and zero-width characters.
    format!("{:?}", truncate(text, max))
}

/// Unicode characters that reorder or hide text on a terminal or a page.
fn is_format_override(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}

/// Every occurrence of each secret in `text` replaced by `[redacted]`,
/// and so is the start of one that a bound cut off: before an ellipsis
/// (what [`truncate`] leaves) or at the very end of the text. Server text
/// is bounded where it is read, before it reaches the secrets; a key cut
/// in half would otherwise show its first half. Empty secrets and very
/// short ones (which would blank ordinary words) are skipped; real keys
/// and passwords are longer than three bytes.
pub fn redact<'a>(text: &str, secrets: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = text.to_owned();
    for secret in secrets.into_iter().filter(|s| s.len() >= MIN_SECRET_LEN) {
        if out.contains(secret) {
            out = out.replace(secret, REDACTED);
        }
        out = redact_cut_start(&out, secret);
    }
    out
}

/// Shortest secret (and shortest cut-off start of one) that is redacted.
const MIN_SECRET_LEN: usize = 4;

/// `text` with the start of `secret` redacted where it ends a piece:
/// before each `…` and at the end.
fn redact_cut_start(text: &str, secret: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, piece) in text.split('…').enumerate() {
        if i > 0 {
            out.push('…');
        }
        let cut = (MIN_SECRET_LEN..secret.len())
            .rev()
            .filter(|&k| secret.is_char_boundary(k))
            .find(|&k| piece.ends_with(&secret[..k]));
        match cut {
            Some(k) => {
                out.push_str(&piece[..piece.len() - k]);
                out.push_str(REDACTED);
            }
            None => out.push_str(piece),
        }
    }
    out
}

/// Seconds as milliseconds rounded to 0.1 ms, for log fields: what a
/// person reads, not fifteen digits.
pub fn round_ms(seconds: f64) -> f64 {
    (seconds * 1e4).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_cannot_forge_lines_or_titles() {
        let hostile = "0.32.0\n2026-01-01T00:00:00Z ERROR vllm_sentinel::daemon: FORGED LINE\x1b]0;owned\x07\0x";
        let cleaned = clean(hostile, MAX_ID_LEN);
        assert!(!cleaned.contains('\n') && !cleaned.contains('\x1b') && !cleaned.contains('\0'));
        assert!(!cleaned.chars().any(char::is_control), "{cleaned:?}");
        assert!(cleaned.starts_with("0.32.0 2026"), "{cleaned:?}");
        assert_eq!(clean("a\u{202E}b", 10), "a b");
        let shown = quoted("a\u{202E}b\u{2066}\n\u{1b}[31m\u{200B}", 40);
        assert_eq!(shown, r#""a\u{202e}b\u{2066}\n\u{1b}[31m\u{200b}""#);
        assert!(
            !shown
                .chars()
                .any(|c| c.is_control() || is_format_override(c))
        );
    }

    #[test]
    fn long_text_is_bounded_at_a_character_boundary() {
        let long = "é".repeat(1_000_000);
        let cleaned = clean(&long, 11);
        assert!(cleaned.len() <= 11 + '…'.len_utf8(), "{}", cleaned.len());
        assert!(cleaned.ends_with('…'));
        assert_eq!(truncate("short", 10), "short");
    }

    #[test]
    fn long_identifiers_differing_past_the_cut_stay_apart() {
        let a = format!("vllm-0.32.0-{}a", "x".repeat(400));
        let b = format!("vllm-0.32.0-{}b", "x".repeat(400));
        let (ca, cb) = (
            clean_identifier(&a, MAX_ID_LEN),
            clean_identifier(&b, MAX_ID_LEN),
        );
        assert_ne!(ca, cb);
        assert!(
            ca.len() <= MAX_ID_LEN && ca.starts_with("vllm-0.32.0-xxx"),
            "{ca}"
        );
        assert_eq!(ca, clean_identifier(&a, MAX_ID_LEN), "stable");
        assert_eq!(
            clean_identifier("vllm-0.32.0-ab", MAX_ID_LEN),
            "vllm-0.32.0-ab"
        );
    }

    #[test]
    fn secrets_are_replaced_everywhere_and_short_ones_ignored() {
        let text = "Incorrect API key provided: Bearer sk-abc123; again sk-abc123";
        assert_eq!(
            redact(text, ["sk-abc123"]),
            "Incorrect API key provided: Bearer [redacted]; again [redacted]"
        );
        assert_eq!(redact("the key", ["", "e"]), "the key");
    }

    #[test]
    fn the_start_of_a_secret_cut_by_a_bound_is_redacted() {
        let key = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        // Cut by `truncate` (an ellipsis follows), at the end of a
        // preview, and whole elsewhere in the same text.
        let cut = truncate(&format!("you sent: Bearer {key}"), 30);
        assert_eq!(cut, "you sent: Bearer sk-proj-ABCDE…");
        assert_eq!(redact(&cut, [key]), "you sent: Bearer [redacted]…");
        assert_eq!(
            redact(&format!("{key} then {}", &key[..12]), [key]),
            "[redacted] then [redacted]"
        );
        // Three bytes of a key say nothing; a word that is not the key's
        // start is left alone.
        assert_eq!(redact("about sk-…", [key]), "about sk-…");
        assert_eq!(redact("a proj-ABCD…", [key]), "a proj-ABCD…");
        assert_eq!(redact("plain text", [key]), "plain text");
    }
}
