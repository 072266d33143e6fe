//! Incremental stop-string detection for streamed text.

/// Result of feeding one chunk of text to a [`StopChecker`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text that can be shown to the user now.
    pub text: String,
    /// True when a stop string was found; `text` ends right before it and generation
    /// should end.
    pub stopped: bool,
}

/// Incremental stop-string detector for streamed text.
///
/// Text that might be the beginning of a stop string is held back until the next chunk
/// decides it; text before a stop string is released, the stop string itself never is.
#[derive(Debug, Clone, Default)]
pub struct StopChecker {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopChecker {
    /// Creates a checker for the given stop strings (empty strings are ignored).
    pub fn new<I, S>(stops: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let stops = stops
            .into_iter()
            .map(Into::into)
            .filter(|s: &String| !s.is_empty())
            .collect();
        Self {
            stops,
            held: String::new(),
            stopped: false,
        }
    }

    /// True once a stop string has been seen; later chunks are ignored.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds the next chunk; returns what is safe to emit and whether a stop was hit.
    pub fn push(&mut self, chunk: &str) -> StopOutput {
        if self.stopped {
            return StopOutput {
                text: String::new(),
                stopped: true,
            };
        }
        self.held.push_str(chunk);
        if let Some(pos) = self.earliest_stop() {
            self.stopped = true;
            let mut text = std::mem::take(&mut self.held);
            text.truncate(pos);
            return StopOutput {
                text,
                stopped: true,
            };
        }
        let keep = self.partial_suffix_len();
        let split = self.held.len() - keep;
        let rest = self.held.split_off(split);
        let text = std::mem::replace(&mut self.held, rest);
        StopOutput {
            text,
            stopped: false,
        }
    }

    /// Releases any held-back text at the end of generation (it did not become a stop).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Byte offset of the earliest complete stop string in the held text.
    fn earliest_stop(&self) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
    }

    /// Length of the longest suffix of the held text that is a proper prefix of a stop.
    fn partial_suffix_len(&self) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            let max = (stop.len() - 1).min(self.held.len());
            // Longest first so the first hit per stop is its best.
            for len in (best + 1..=max).rev() {
                // A prefix cut inside a multi-byte char can never match at a char boundary
                // of the held text; skip it (slicing there would panic).
                if !stop.is_char_boundary(len) {
                    continue;
                }
                if self.held.ends_with(&stop[..len]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_split_across_chunks() {
        let mut c = StopChecker::new(["</stop>"]);
        let a = c.push("hello </st");
        assert_eq!(
            a,
            StopOutput {
                text: "hello ".into(),
                stopped: false
            }
        );
        let b = c.push("op> ignored");
        assert_eq!(
            b,
            StopOutput {
                text: String::new(),
                stopped: true
            }
        );
        assert!(c.is_stopped());
        assert!(c.push("more").stopped);
    }

    #[test]
    fn false_partial_match_is_released() {
        let mut c = StopChecker::new(vec!["END".to_string()]);
        assert_eq!(c.push("the E").text, "the ");
        assert_eq!(c.push("N").text, "");
        let out = c.push("d of it");
        assert_eq!(
            out,
            StopOutput {
                text: "ENd of it".into(),
                stopped: false
            }
        );
        assert_eq!(c.push("E").text, "");
        assert_eq!(c.flush(), "E");
    }

    #[test]
    fn earliest_of_several_stops_wins_and_multibyte_is_safe() {
        let mut c = StopChecker::new(["ß!", "xyz", ""]);
        assert_eq!(c.push("aß").text, "a");
        let out = c.push("?xyzß!");
        assert_eq!(
            out,
            StopOutput {
                text: "ß?".into(),
                stopped: true
            }
        );

        let mut c = StopChecker::new(["b", "abc"]);
        assert_eq!(c.push("xa").text, "x");
        // "abc" starts before "b", so nothing of it is released.
        assert_eq!(
            c.push("bc"),
            StopOutput {
                text: String::new(),
                stopped: true
            }
        );
    }
}
