//! A bound on how many warnings a view logs: a pod can make a view fail as often as it
//! likes, and every failure it causes must not become a line on the node's disk.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lets through at most `burst` events per `window`; counts the rest, so that the
/// first event of the next window can say how many were held back.
pub struct RateLimit {
    burst: u32,
    window: Duration,
    state: Mutex<Window>,
}

struct Window {
    start: Option<Instant>,
    passed: u32,
    held: u64,
}

/// Whether an event may be logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `held_before` events were held back since the last one logged.
    Log { held_before: u64 },
    /// Do not log it (it is counted).
    Hold,
}

impl RateLimit {
    pub fn new(burst: u32, window: Duration) -> RateLimit {
        RateLimit {
            burst,
            window,
            state: Mutex::new(Window {
                start: None,
                passed: 0,
                held: 0,
            }),
        }
    }

    /// The verdict on an event happening `now`.
    pub fn check(&self, now: Instant) -> Verdict {
        let mut w = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if w.start.is_none_or(|s| now.duration_since(s) >= self.window) {
            w.start = Some(now);
            w.passed = 0;
        }
        if w.passed < self.burst {
            w.passed += 1;
            let held_before = std::mem::take(&mut w.held);
            Verdict::Log { held_before }
        } else {
            w.held += 1;
            Verdict::Hold
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_silence_then_a_count() {
        let r = RateLimit::new(3, Duration::from_secs(10));
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(r.check(t), Verdict::Log { held_before: 0 });
        }
        for i in 0..1000 {
            assert_eq!(r.check(t + Duration::from_millis(i)), Verdict::Hold);
        }
        assert_eq!(
            r.check(t + Duration::from_secs(10)),
            Verdict::Log { held_before: 1000 }
        );
        assert_eq!(
            r.check(t + Duration::from_secs(11)),
            Verdict::Log { held_before: 0 }
        );
    }
}
