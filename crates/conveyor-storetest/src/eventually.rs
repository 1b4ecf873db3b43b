//! Waiting for a condition that comes true later: the one poll loop of the workspace's
//! integration tests.
//!
//! [`eventually`] polls an async check until it is satisfied or a deadline passes, then panics
//! saying what was awaited and what the check observed last; [`eventually_blocking`] does the
//! same for tests that drive blocking clients (child processes, `reqwest::blocking`). A check
//! answers with an [`Outcome`]: `true`/`false`, `Some(value)`/`None`, or `Ok(value)`/
//! `Err(observed)`, where `observed` (anything `Display`) is what the panic message shows.
//!
//! The async check is a closure returning a future (`|| async { .. }`, or `async move` to copy
//! the references it uses): a plain `FnMut`, so a test's future stays `Send` for
//! `tokio::spawn`. The async form measures its deadline on tokio's clock, so on a paused clock it waits in
//! virtual time. Polling is for the outside world (a process, a database, a server's background
//! task); a test that can await a signal awaits the signal instead.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// How long the plain forms wait.
pub const DEFAULT_WITHIN: Duration = Duration::from_secs(30);

/// How often a check runs.
pub const POLL_EVERY: Duration = Duration::from_millis(20);

/// What a check answers: ready with a value, or not yet (and what it observed).
pub trait Outcome {
    type Ready;
    /// `Ok`: the condition holds. `Err`: not yet; the text describes what was observed.
    fn ready(self) -> Result<Self::Ready, String>;
}

impl Outcome for bool {
    type Ready = ();
    fn ready(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("false".to_string())
        }
    }
}

impl<T> Outcome for Option<T> {
    type Ready = T;
    fn ready(self) -> Result<T, String> {
        self.ok_or_else(|| "None".to_string())
    }
}

impl<T, E: Display> Outcome for Result<T, E> {
    type Ready = T;
    fn ready(self) -> Result<T, String> {
        self.map_err(|observed| observed.to_string())
    }
}

/// A condition that did not come true in time; its `Display` is the panic message of
/// [`eventually`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    pub what: String,
    pub within: Duration,
    pub checks: u64,
    /// What the last check observed.
    pub last: String,
}

impl Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "timed out after {:?} ({} checks) waiting for {}; last observed: {}",
            self.within, self.checks, self.what, self.last
        )
    }
}

impl std::error::Error for TimedOut {}

/// Polls `check` until it is ready, for up to [`DEFAULT_WITHIN`]; returns its value.
pub async fn eventually<O: Outcome, Fut: Future<Output = O>>(
    what: &str,
    check: impl FnMut() -> Fut,
) -> O::Ready {
    eventually_within(what, DEFAULT_WITHIN, check).await
}

/// Polls `check` every [`POLL_EVERY`] until it is ready; panics naming `what` and the last
/// observation once `within` has passed on tokio's clock.
pub async fn eventually_within<O: Outcome, Fut: Future<Output = O>>(
    what: &str,
    within: Duration,
    check: impl FnMut() -> Fut,
) -> O::Ready {
    try_eventually_within(what, within, check)
        .await
        .unwrap_or_else(|timed_out| panic!("{timed_out}"))
}

/// [`eventually_within`] that answers [`TimedOut`] instead of panicking, for tests that clean up
/// or gather evidence before they fail.
pub async fn try_eventually_within<O: Outcome, Fut: Future<Output = O>>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Fut,
) -> Result<O::Ready, TimedOut> {
    let deadline = tokio::time::Instant::now() + within;
    let mut checks = 0;
    loop {
        checks += 1;
        let last = match check().await.ready() {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(TimedOut {
                what: what.to_string(),
                within,
                checks,
                last,
            });
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// [`eventually`] for blocking tests: polls `check` on this thread for up to
/// [`DEFAULT_WITHIN`].
pub fn eventually_blocking<O: Outcome>(what: &str, check: impl FnMut() -> O) -> O::Ready {
    eventually_blocking_within(what, DEFAULT_WITHIN, check)
}

/// [`eventually_within`] for blocking tests (the thread sleeps between checks).
pub fn eventually_blocking_within<O: Outcome>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> O,
) -> O::Ready {
    let deadline = std::time::Instant::now() + within;
    let mut checks = 0;
    loop {
        checks += 1;
        let last = match check().ready() {
            Ok(value) => return value,
            Err(last) => last,
        };
        if std::time::Instant::now() >= deadline {
            let timed_out = TimedOut {
                what: what.to_string(),
                within,
                checks,
                last,
            };
            panic!("{timed_out}");
        }
        std::thread::sleep(POLL_EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
        *payload.downcast::<String>().expect("a formatted message")
    }

    #[tokio::test]
    async fn returns_the_value_once_ready() {
        let calls = std::cell::Cell::new(0);
        let value = eventually("the third call", || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move { (n >= 3).then_some(n) }
        })
        .await;
        assert_eq!(value, 3);
        eventually("a true check", || async { calls.get() == 3 }).await;
        let ok: u8 = eventually("an Ok", || async { Ok::<_, String>(7) }).await;
        assert_eq!(ok, 7);
    }

    #[test]
    fn async_form_panics_with_what_and_the_last_observation() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let n = std::cell::Cell::new(40);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(eventually_within(
                "the answer",
                Duration::from_millis(60),
                || {
                    n.set(n.get() + 1);
                    let observed = format!("still {}", n.get());
                    async move { Err::<(), _>(observed) }
                },
            ))
        }));
        let n = n.get();
        let message = panic_text(result.expect_err("times out"));
        assert!(
            message.contains("waiting for the answer; last observed: still 4"),
            "{message}"
        );
        assert!(n > 41, "polled more than once: {n}");
    }

    #[tokio::test]
    async fn try_form_answers_timed_out() {
        let timed_out =
            try_eventually_within("never", Duration::from_millis(50), || async { None::<()> })
                .await
                .expect_err("times out");
        assert_eq!(timed_out.what, "never");
        assert_eq!(timed_out.last, "None");
        assert!(timed_out.checks >= 2, "{timed_out:?}");
    }

    #[test]
    fn blocking_form_polls_and_times_out() {
        let mut n = 0;
        let value = eventually_blocking("n to reach 2", || {
            if n >= 2 {
                Ok(n)
            } else {
                n += 1;
                Err(n)
            }
        });
        assert_eq!(value, 2);
        let result = std::panic::catch_unwind(|| {
            eventually_blocking_within("nothing", Duration::from_millis(50), || false)
        });
        let message = panic_text(result.expect_err("times out"));
        assert!(
            message.contains("waiting for nothing; last observed: false"),
            "{message}"
        );
    }
}
