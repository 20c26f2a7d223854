//! The time the manager's decisions and records read: the system clock in production, a
//! settable one in tests. Measuring how long a reconcile took is not a decision and uses
//! `Instant` directly.

use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// The time from `then` to `now` (zero if `now` is earlier).
pub fn elapsed(then: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(then)).unwrap_or_default()
}

/// Where the manager reads the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The system's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that stands still until it is set or advanced, for tests.
#[derive(Debug)]
pub struct TestClock {
    at: Mutex<Timestamp>,
}

impl TestClock {
    /// A clock standing at `at`.
    pub fn new(at: Timestamp) -> Self {
        Self { at: Mutex::new(at) }
    }

    /// Moves the clock to `at`.
    pub fn set(&self, at: Timestamp) {
        if let Ok(mut now) = self.at.lock() {
            *now = at;
        }
    }

    /// Moves the clock on by `by`.
    pub fn advance(&self, by: Duration) {
        if let Ok(mut now) = self.at.lock() {
            *now = now.checked_add(by).unwrap_or(*now);
        }
    }
}

impl Clock for TestClock {
    fn now(&self) -> Timestamp {
        self.at.lock().map_or(Timestamp::UNIX_EPOCH, |t| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_clock_moves_only_when_told() {
        let start: Timestamp = "2026-12-03T10:00:00Z".parse().expect("timestamp");
        let clock = TestClock::new(start);
        assert_eq!(clock.now(), start);
        clock.advance(Duration::from_secs(90));
        assert_eq!(clock.now().to_string(), "2026-12-03T10:01:30Z");
        clock.set(start);
        assert_eq!(clock.now(), start);
    }
}
