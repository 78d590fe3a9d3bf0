//! Incremental Server-Sent Events decoder: bytes in, `data` payloads out,
//! whatever the byte boundaries of the reads.
//!
//! Follows the WHATWG event-stream rules that matter for OpenAI-style
//! streams: lines end in `\n`, `\r\n` or `\r`; a line starting with `:` is a
//! comment; `data:` lines (one optional space after the colon) accumulate,
//! joined by `\n`; a blank line dispatches the event; one UTF-8 byte-order
//! mark opening the stream is dropped (else its first line, often the
//! first token, would not read as `data`). Other fields (`event`,
//! `id`, `retry`) are ignored because completion streams do not use them.
//!
//! A line and an event's data are bounded ([`MAX_EVENT_BYTES`]): a server
//! that sends data without a newline must not grow the daemon without end.

/// The longest line, and the largest event, a stream may send. A real
/// completion chunk is a few hundred bytes; a chunk with logprobs for a long
/// answer a few tens of KiB.
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// A stream broke the decoder's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("the stream sent a line longer than {} MiB", MAX_EVENT_BYTES >> 20)]
    LineTooLong,
    #[error("the stream sent an event larger than {} MiB", MAX_EVENT_BYTES >> 20)]
    EventTooLarge,
}

/// Decoder state carried between reads.
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// `data` of the current event so far.
    data: Vec<u8>,
    has_data: bool,
    /// The previous read ended in `\r`: a leading `\n` now belongs to it.
    after_cr: bool,
    /// Past the stream's first bytes, where a byte-order mark may be.
    past_start: bool,
    /// How many bytes of a byte-order mark the stream opened with so far.
    bom_matched: usize,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one read; calls `on_event` with the data of every event the
    /// read completes, in order. Fails, leaving the decoder unusable, once a
    /// line or an event passes [`MAX_EVENT_BYTES`].
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        mut on_event: impl FnMut(&[u8]),
    ) -> Result<(), SseError> {
        if !self.past_start {
            let want = &BOM[self.bom_matched..];
            let n = want.len().min(bytes.len());
            if bytes[..n] == want[..n] {
                self.bom_matched += n;
                bytes = &bytes[n..];
                if self.bom_matched < BOM.len() {
                    return Ok(());
                }
            } else {
                // Not a mark after all: the bytes held for one are text.
                self.extend_line(&BOM[..self.bom_matched])?;
            }
            self.past_start = true;
        }
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while let Some(pos) = memchr::memchr2(b'\n', b'\r', bytes) {
            let terminator = bytes[pos];
            if self.line.is_empty() {
                self.process_line(&bytes[..pos], &mut on_event)?;
            } else {
                self.extend_line(&bytes[..pos])?;
                let line = std::mem::take(&mut self.line);
                self.process_line(&line, &mut on_event)?;
                self.line = line;
                self.line.clear();
            }
            bytes = &bytes[pos + 1..];
            if terminator == b'\r' {
                match bytes.first() {
                    Some(b'\n') => bytes = &bytes[1..],
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
        }
        self.extend_line(bytes)
    }

    fn extend_line(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len() + bytes.len() > MAX_EVENT_BYTES {
            return Err(SseError::LineTooLong);
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// Ends the stream: an event left without its closing blank line is
    /// still delivered, since some servers omit the final one.
    pub fn finish(&mut self, mut on_event: impl FnMut(&[u8])) -> Result<(), SseError> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, &mut on_event)?;
        }
        self.dispatch(&mut on_event);
        Ok(())
    }

    fn process_line(
        &mut self,
        line: &[u8],
        on_event: &mut impl FnMut(&[u8]),
    ) -> Result<(), SseError> {
        if line.is_empty() {
            self.dispatch(on_event);
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        if line.len() > MAX_EVENT_BYTES {
            return Err(SseError::LineTooLong);
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            if self.data.len() + value.len() + 1 > MAX_EVENT_BYTES {
                return Err(SseError::EventTooLarge);
            }
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
        Ok(())
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(&[u8])) {
        if self.has_data {
            on_event(&self.data);
            self.data.clear();
            self.has_data = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_in_pieces(stream: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut decoder = SseDecoder::new();
        let mut events = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
            let cut = cut.clamp(start, stream.len());
            decoder
                .feed(&stream[start..cut], |e| events.push(e.to_vec()))
                .unwrap();
            start = cut;
        }
        decoder.finish(|e| events.push(e.to_vec())).unwrap();
        events
    }

    #[test]
    fn a_line_without_end_is_cut_at_the_bound() {
        let mut decoder = SseDecoder::new();
        let piece = vec![b'x'; 64 * 1024];
        let mut fed = 0;
        let err = loop {
            match decoder.feed(&piece, |_| panic!("no event expected")) {
                Ok(()) => fed += piece.len(),
                Err(e) => break e,
            }
        };
        assert_eq!(err, SseError::LineTooLong);
        assert_eq!(fed, MAX_EVENT_BYTES, "cut at the first read past the bound");
        assert!(decoder.line.capacity() <= 2 * MAX_EVENT_BYTES);
    }

    #[test]
    fn an_event_of_many_data_lines_is_cut_at_the_bound() {
        let mut decoder = SseDecoder::new();
        let line = format!("data: {}\n", "y".repeat(1000));
        let mut err = None;
        for _ in 0..2000 {
            if let Err(e) = decoder.feed(line.as_bytes(), |_| panic!("no event expected")) {
                err = Some(e);
                break;
            }
        }
        assert_eq!(err, Some(SseError::EventTooLarge));
        assert!(decoder.data.len() <= MAX_EVENT_BYTES);
    }

    #[test]
    fn an_event_just_under_the_bound_decodes() {
        // The bound counts the whole line, `data: ` included.
        let payload = "z".repeat(MAX_EVENT_BYTES - "data: ".len());
        let stream = format!("data: {payload}\n\n");
        assert_eq!(
            decode_in_pieces(stream.as_bytes(), &[100, 70_000]),
            vec![payload.into_bytes()]
        );
    }

    const VLLM_LIKE: &[u8] = b": ping\r\n\r\ndata: {\"choices\":[{\"text\":\"\"}]}\r\n\r\n\
data: {\"choices\":[{\"text\":\"a\"}]}\n\n\
data:{\"choices\":[],\"usage\":{\"completion_tokens\":2}}\r\r\
event: message\nid: 7\ndata: line1\ndata: line2\n\n\
data: [DONE]\n\n";

    fn expected() -> Vec<Vec<u8>> {
        vec![
            b"{\"choices\":[{\"text\":\"\"}]}".to_vec(),
            b"{\"choices\":[{\"text\":\"a\"}]}".to_vec(),
            b"{\"choices\":[],\"usage\":{\"completion_tokens\":2}}".to_vec(),
            b"line1\nline2".to_vec(),
            b"[DONE]".to_vec(),
        ]
    }

    #[test]
    fn whole_stream_decodes() {
        assert_eq!(decode_in_pieces(VLLM_LIKE, &[]), expected());
    }

    #[test]
    fn every_single_split_point_gives_the_same_events() {
        for cut in 0..=VLLM_LIKE.len() {
            assert_eq!(
                decode_in_pieces(VLLM_LIKE, &[cut]),
                expected(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn byte_at_a_time_gives_the_same_events() {
        let cuts: Vec<usize> = (1..VLLM_LIKE.len()).collect();
        assert_eq!(decode_in_pieces(VLLM_LIKE, &cuts), expected());
    }

    #[test]
    fn a_byte_order_mark_opening_the_stream_is_dropped_wherever_the_reads_cut() {
        // Opening with data, whose first event the mark would hide.
        let marked = [BOM, b"data: first\n\n", VLLM_LIKE].concat();
        let want = [vec![b"first".to_vec()], expected()].concat();
        for cut in 0..=marked.len() {
            assert_eq!(decode_in_pieces(&marked, &[cut]), want, "cut at {cut}");
        }
        let cuts: Vec<usize> = (1..marked.len()).collect();
        assert_eq!(decode_in_pieces(&marked, &cuts), want);
    }

    #[test]
    fn only_a_whole_mark_at_the_start_is_dropped() {
        // Later, a mark is part of its line: `\u{FEFF}data` is no field
        // the decoder knows.
        let later = [b"data: a\n\n", BOM, b"data: b\n\n"].concat();
        assert_eq!(decode_in_pieces(&later, &[]), vec![b"a".to_vec()]);
        // Two bytes of a mark and then a field: the bytes are kept, so
        // the line is no `data` line (dropped, it would read as one).
        let half = [&BOM[..2], b"data: c\n\ndata: d\n\n"].concat();
        for cut in 0..=half.len() {
            for first in 0..=2 {
                assert_eq!(
                    decode_in_pieces(&half, &[first, cut]),
                    vec![b"d".to_vec()],
                    "cuts at {first} and {cut}"
                );
            }
        }
    }

    #[test]
    fn event_without_final_blank_line_is_delivered_at_finish() {
        assert_eq!(decode_in_pieces(b"data: x", &[]), vec![b"x".to_vec()]);
    }

    #[test]
    fn comments_and_blank_lines_alone_yield_nothing() {
        assert!(decode_in_pieces(b": a\n\n\n:b\r\n\r\n", &[]).is_empty());
    }

    proptest! {
        #[test]
        fn any_split_of_any_event_sequence_matches(
            payloads in proptest::collection::vec("[a-z{}\":, \\[\\]0-9]{0,40}", 1..8),
            crlf in any::<bool>(),
            cuts in proptest::collection::vec(0usize..400, 0..12),
        ) {
            let eol = if crlf { "\r\n" } else { "\n" };
            let mut stream = String::new();
            for p in &payloads {
                stream.push_str(&format!(": keep-alive{eol}data: {p}{eol}{eol}"));
            }
            let mut cuts = cuts;
            cuts.sort_unstable();
            let got = decode_in_pieces(stream.as_bytes(), &cuts);
            let want: Vec<Vec<u8>> = payloads.iter().map(|p| p.as_bytes().to_vec()).collect();
            prop_assert_eq!(got, want);
        }
    }
}
