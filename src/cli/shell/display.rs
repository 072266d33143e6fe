//! How a reply appears as it streams: thinking dimmed (or folded into a one-line count),
//! then the answer.

use std::io::Write;

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";
/// Back to the start of the line and clear it, to redraw the thinking counter in place.
const REDRAW: &str = "\r\x1b[2K";

/// How thinking is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thinking {
    /// Every token of it.
    Full,
    /// One line counting its tokens.
    Summary,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing shown yet.
    Start,
    Thinking,
    Answer,
}

/// Writes one reply's pieces as they arrive.
pub struct Display<W: Write> {
    out: W,
    /// Terminal escapes (dim text, redrawing the counter) are allowed.
    ansi: bool,
    thinking: Thinking,
    phase: Phase,
    /// Tokens seen before the answer began (the thinking, with its markers).
    thinking_tokens: usize,
    /// Any thinking arrived.
    thought: bool,
    /// The last thing written ended a line.
    at_line_start: bool,
}

impl<W: Write> Display<W> {
    /// A display for one reply.
    pub fn new(out: W, ansi: bool, thinking: Thinking) -> Self {
        Self { out, ansi, thinking, phase: Phase::Start, thinking_tokens: 0, thought: false, at_line_start: true }
    }

    /// A token's pieces have been shown: counts it as thinking unless the answer began.
    pub fn token(&mut self) -> std::io::Result<()> {
        if self.phase == Phase::Answer {
            return Ok(());
        }
        self.thinking_tokens += 1;
        if self.phase == Phase::Thinking && self.thinking == Thinking::Summary && self.ansi {
            let line = self.summary();
            write!(self.out, "{REDRAW}{DIM}{line}{RESET}")?;
            self.out.flush()?;
        }
        Ok(())
    }

    /// A piece of thinking.
    pub fn reasoning(&mut self, text: &str) -> std::io::Result<()> {
        if self.phase == Phase::Answer || text.is_empty() {
            return Ok(());
        }
        if self.phase == Phase::Start {
            self.phase = Phase::Thinking;
            self.thought = true;
            if self.thinking == Thinking::Full {
                self.write(if self.ansi { DIM } else { "[thinking]\n" })?;
            }
        }
        if self.thinking == Thinking::Full {
            self.write_model(text)?;
        }
        self.out.flush()
    }

    /// A piece of the answer.
    pub fn text(&mut self, text: &str) -> std::io::Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        if self.phase != Phase::Answer {
            self.end_thinking()?;
            self.phase = Phase::Answer;
        }
        self.write_model(text)?;
        self.out.flush()
    }

    /// The reply ended (`stopped`: by Ctrl-C); leaves the cursor on a fresh line.
    pub fn finish(&mut self, stopped: bool) -> std::io::Result<()> {
        self.end_thinking()?;
        if stopped {
            if !self.at_line_start {
                self.write("\n")?;
            }
            self.write(if self.ansi { "\x1b[2m[stopped]\x1b[0m" } else { "[stopped]" })?;
        }
        if !self.at_line_start || self.phase == Phase::Start {
            self.write("\n")?;
        }
        self.out.flush()
    }

    /// Tokens counted as thinking (with its markers); 0 when the model did not think.
    pub fn thinking_tokens(&self) -> usize {
        if self.thought { self.thinking_tokens } else { 0 }
    }

    fn summary(&self) -> String {
        format!("[thinking: {} tokens]", self.thinking_tokens)
    }

    /// Closes the thinking part (once) so the answer starts on its own line.
    fn end_thinking(&mut self) -> std::io::Result<()> {
        if self.phase != Phase::Thinking {
            return Ok(());
        }
        self.phase = Phase::Answer;
        match (self.thinking, self.ansi) {
            (Thinking::Full, true) => {
                self.write(RESET)?;
                self.write("\n\n")
            }
            (Thinking::Full, false) => {
                if !self.at_line_start {
                    self.write("\n")?;
                }
                self.write("[/thinking]\n")
            }
            (Thinking::Summary, true) => {
                let line = self.summary();
                self.write(&format!("{REDRAW}{DIM}{line}{RESET}\n"))
            }
            (Thinking::Summary, false) => {
                let line = self.summary();
                self.write(&format!("{line}\n"))
            }
        }
    }

    /// Model text: on a terminal its control characters are shown as `�`, so stray
    /// escape sequences from the model cannot drive the terminal.
    fn write_model(&mut self, s: &str) -> std::io::Result<()> {
        if self.ansi && s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
            let clean: String = s.chars().map(|c| if c.is_control() && c != '\n' && c != '\t' { '\u{fffd}' } else { c }).collect();
            return self.write(&clean);
        }
        self.write(s)
    }

    fn write(&mut self, s: &str) -> std::io::Result<()> {
        if s.is_empty() {
            return Ok(());
        }
        self.out.write_all(s.as_bytes())?;
        self.at_line_start = s.ends_with('\n');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plays tokens: `Some((true, t))` thinking, `Some((false, t))` answer, `None` a token
    /// whose text is still held back.
    fn play(ansi: bool, thinking: Thinking, pieces: &[Option<(bool, &str)>], stopped: bool) -> (String, usize) {
        let mut d = Display::new(Vec::new(), ansi, thinking);
        for p in pieces {
            match p {
                Some((true, t)) => d.reasoning(t).unwrap(),
                Some((false, t)) => d.text(t).unwrap(),
                None => {}
            }
            d.token().unwrap();
        }
        d.finish(stopped).unwrap();
        let n = d.thinking_tokens();
        (String::from_utf8(d.out).unwrap(), n)
    }

    const REPLY: [Option<(bool, &str)>; 5] = [None, Some((true, "let me")), Some((true, " see")), None, Some((false, "Hi!"))];

    #[test]
    fn full_thinking_is_dimmed_on_a_terminal_and_marked_in_a_pipe() {
        assert_eq!(play(true, Thinking::Full, &REPLY, false), ("\x1b[2mlet me see\x1b[0m\n\nHi!\n".to_string(), 4));
        assert_eq!(play(false, Thinking::Full, &REPLY, false).0, "[thinking]\nlet me see\n[/thinking]\nHi!\n");
    }

    #[test]
    fn summary_counts_thinking_tokens() {
        assert_eq!(play(false, Thinking::Summary, &REPLY, false).0, "[thinking: 4 tokens]\nHi!\n");
        let (out, _) = play(true, Thinking::Summary, &REPLY, false);
        assert!(out.starts_with("\r\x1b[2K\x1b[2m[thinking: 2 tokens]"), "{out:?}");
        assert!(out.ends_with("\r\x1b[2K\x1b[2m[thinking: 4 tokens]\x1b[0m\nHi!\n"), "{out:?}");
    }

    #[test]
    fn plain_answers_and_stops() {
        assert_eq!(play(false, Thinking::Full, &[Some((false, "a")), Some((false, "b\n"))], false), ("ab\n".to_string(), 0));
        assert_eq!(play(false, Thinking::Full, &[], false).0, "\n");
        assert_eq!(play(false, Thinking::Full, &[Some((false, "par"))], true).0, "par\n[stopped]\n");
        assert_eq!(play(true, Thinking::Full, &[Some((false, "a\x1b[2Jb\tc\n"))], false).0, "a\u{fffd}[2Jb\tc\n");
        assert_eq!(play(false, Thinking::Full, &[Some((false, "a\x1bb"))], false).0, "a\x1bb\n");
        assert_eq!(play(true, Thinking::Full, &[Some((true, "hm"))], true).0, "\x1b[2mhm\x1b[0m\n\n\x1b[2m[stopped]\x1b[0m\n");
    }
}
