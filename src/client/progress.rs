//! Progress of long waits (`apply --wait`, `wait`, `heartbeat --every`,
//! `lease keepalive --every`): one status line on stderr, rewritten in
//! place, when stderr is a terminal; nothing otherwise (scripts and logs
//! get the result lines only).

use std::io::{IsTerminal, Write};

pub struct Progress {
    on: bool,
    shown: bool,
}

impl Default for Progress {
    fn default() -> Progress {
        Progress::new()
    }
}

impl Progress {
    /// Shown only when stderr is a terminal.
    pub fn new() -> Progress {
        Progress { on: std::io::stderr().is_terminal(), shown: false }
    }

    /// Replace the status line.
    pub fn show(&mut self, line: &str) {
        if !self.on {
            return;
        }
        let mut err = std::io::stderr().lock();
        // Carriage return, erase to the end of the line, the new text.
        let _ = write!(err, "\r\x1b[K{line}");
        let _ = err.flush();
        self.shown = true;
    }

    /// Erase the status line (before a result or an error is printed).
    pub fn clear(&mut self) {
        if self.shown {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
            self.shown = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}
