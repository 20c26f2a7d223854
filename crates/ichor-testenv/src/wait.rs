//! Waiting for a condition in tests: [`eventually`] polls a check until it holds, and fails
//! naming what it waited for and what it saw last.
//!
//! A check returns `bool`, `Option<T>` (`Some` when done) or `Result<T, E>` (`Err` holds the
//! observation so far, shown if the wait times out).

use std::fmt;
use std::future::Future;
use std::time::Duration;

/// The first pause between two checks; it doubles up to [`MAX_INTERVAL`], so a quick
/// condition is seen at once and a slow one does not flood what it polls.
const FIRST_INTERVAL: Duration = Duration::from_millis(10);
/// The longest pause between two checks.
const MAX_INTERVAL: Duration = Duration::from_millis(250);

/// What one check saw: done with a value, or not yet (with a description of what it saw).
pub trait Observation {
    /// The value a finished wait returns.
    type Value;
    /// `Ok` when the condition holds, `Err` with what was seen otherwise.
    fn outcome(self) -> Result<Self::Value, String>;
}

impl Observation for bool {
    type Value = ();
    fn outcome(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("the check returned false".into())
        }
    }
}

impl<T> Observation for Option<T> {
    type Value = T;
    fn outcome(self) -> Result<T, String> {
        self.ok_or_else(|| "the check returned nothing yet".into())
    }
}

impl<T, E: fmt::Display> Observation for Result<T, E> {
    type Value = T;
    fn outcome(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// A wait that ran out of time.
#[derive(Clone, PartialEq, Eq)]
pub struct Timeout {
    /// What was waited for.
    pub what: String,
    /// How long.
    pub limit: Duration,
    /// What the last check saw.
    pub last: String,
}

impl fmt::Display for Timeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting for {}; last seen: {}",
            self.limit, self.what, self.last
        )
    }
}

// `unwrap` and `expect` print `Debug`: make it the sentence.
impl fmt::Debug for Timeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Timeout {}

/// Checks until `check` holds and returns its value; after `limit`, returns a [`Timeout`]
/// naming `what` and the last observation. The check runs at least once.
pub async fn try_eventually<O, F, Fut>(
    what: &str,
    limit: Duration,
    mut check: F,
) -> Result<O::Value, Timeout>
where
    O: Observation,
    F: FnMut() -> Fut,
    Fut: Future<Output = O>,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut interval = FIRST_INTERVAL;
    loop {
        let last = match check().await.outcome() {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(Timeout {
                what: what.to_owned(),
                limit,
                last,
            });
        }
        tokio::time::sleep(interval.min(deadline - now)).await;
        interval = (interval * 2).min(MAX_INTERVAL);
    }
}

/// Like [`try_eventually`], but panics with the timeout's message: for tests.
pub async fn eventually<O, F, Fut>(what: &str, limit: Duration, check: F) -> O::Value
where
    O: Observation,
    F: FnMut() -> Fut,
    Fut: Future<Output = O>,
{
    match try_eventually(what, limit, check).await {
        Ok(value) => value,
        Err(timeout) => panic!("{timeout}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_value_once_the_check_holds() {
        let mut calls = 0;
        let value = eventually("the third call", Duration::from_secs(5), || {
            calls += 1;
            let n = calls;
            async move { (n >= 3).then_some(n) }
        })
        .await;
        assert_eq!(value, 3);
    }

    #[tokio::test]
    async fn a_timeout_names_what_and_the_last_observation() {
        let err = try_eventually("a miracle", Duration::from_millis(30), || async {
            Err::<(), _>("still 2 of 3")
        })
        .await
        .expect_err("never holds");
        assert_eq!(err.what, "a miracle");
        assert_eq!(err.last, "still 2 of 3");
        let message = err.to_string();
        assert!(
            message.contains("a miracle") && message.contains("still 2 of 3"),
            "{message}"
        );
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for nothing")]
    async fn eventually_panics_on_timeout() {
        eventually("nothing", Duration::from_millis(10), || async { false }).await;
    }
}
