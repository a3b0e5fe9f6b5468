//! The waits of a compose call: the 409 backoff of `call`, the abortable `pause` and the poll
//! interval of a wait. `pause` runs on tokio's paused clock (ten seconds in no time). `call`
//! writes its attempts to SQLite, whose pool times out on a paused clock (tokio jumps to the
//! pool's acquire deadline while the database thread works), so its backoff runs on the real
//! clock in milliseconds, asserting the lower bounds a sleep guarantees and the cap.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{call, Call};
use crate::compose::ComposeError;
use crate::config::{
    ComposeTuning, EnvMap, HostConfig, HttpTuning, NotificationsConfig, ResolvedConfig, Secret,
};
use crate::domain::state::AttemptOutcome;
use crate::engine::step_run::{pause, poll_interval, StepRun};
use crate::engine::Engine;
use crate::store::{NewStep, Store};

const SECOND: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn config(dir: &std::path::Path, tuning: ComposeTuning) -> ResolvedConfig {
    let host = HostConfig {
        name: "h1".into(),
        // Never called: the tests hand `call` the compose answers themselves.
        compose_manager_url: "http://127.0.0.1:9".into(),
        token: Secret::new("t"),
        token_env: None,
        env: EnvMap::new(BTreeMap::new()),
        project: "work".into(),
        replicas: BTreeMap::new(),
        windows: Vec::new(),
        model_cache: None,
    };
    ResolvedConfig {
        public_url: None,
        listen: "127.0.0.1:0".parse().expect("addr"),
        database: dir.join("canaryd.db"),
        runbooks_dir: dir.to_path_buf(),
        tokens: Vec::new(),
        hosts: BTreeMap::from([("h1".to_owned(), host)]),
        compose: tuning,
        http: HttpTuning::default(),
        engine: Default::default(),
        retention_days: None,
        notifications: NotificationsConfig::default(),
        prometheus: None,
    }
}

/// An engine whose 409 backoff starts at 20 ms and stops doubling at 80 ms, and a rollout of
/// h1 with one `down` step.
pub(crate) async fn engine(dir: &std::path::Path) -> Engine {
    let tuning = ComposeTuning {
        busy_retry_initial: MS * 20,
        busy_retry_max: MS * 80,
        ..ComposeTuning::default()
    };
    let config = config(dir, tuning);
    let store = Store::open(&config.database).await.expect("store");
    let rollout = crate::store::tests::rollout("ro_1", "h1", "r2", 0);
    let step = NewStep {
        name: "down".into(),
        kind: crate::domain::runbook::StepKindName::Down,
    };
    store
        .create_rollout(&rollout, &[step])
        .await
        .expect("created");
    Engine::new(store, &config, BTreeMap::new()).expect("engine")
}

fn busy() -> ComposeError {
    ComposeError::Busy {
        endpoint: "compose/down".into(),
        in_flight: "compose_up".into(),
    }
}

/// What one `call` did: how it ended, the instant of every send, and the engine (with its
/// database folder) to read the attempts from.
struct Ran {
    result: Call<()>,
    sent: Vec<Instant>,
    engine: Engine,
    _dir: tempfile::TempDir,
}

/// Runs `call` for the down step of a fresh rollout, with `deadline` left; `answer(n, abort)`
/// is the n-th (0-based) answer, and may send the abort.
async fn run_call(
    deadline: chrono::Duration,
    answer: impl Fn(usize, &CancellationToken) -> Result<(), ComposeError>,
) -> Ran {
    run_call_aborted(false, deadline, answer).await
}

/// [`run_call`], with the abort already sent before the call when `aborted`.
async fn run_call_aborted(
    aborted: bool,
    deadline: chrono::Duration,
    answer: impl Fn(usize, &CancellationToken) -> Result<(), ComposeError>,
) -> Ran {
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = engine(dir.path()).await;
    let abort = CancellationToken::new();
    if aborted {
        abort.cancel();
    }
    let store = &engine.inner.store;
    let rollout = store
        .get_rollout("ro_1")
        .await
        .expect("read")
        .expect("found");
    let step = store.steps("ro_1").await.expect("steps").remove(0);
    let run = StepRun::new(&engine, &rollout).expect("the host is configured");
    let sent = RefCell::new(Vec::new());
    let result = call(
        &run,
        &step,
        "compose/down",
        true,
        Utc::now() + deadline,
        &abort,
        || {
            let n = {
                let mut sent = sent.borrow_mut();
                sent.push(Instant::now());
                sent.len() - 1
            };
            let answer = answer(n, &abort);
            async move { answer }
        },
    )
    .await;
    drop(run);
    Ran {
        result,
        sent: sent.into_inner(),
        engine,
        _dir: dir,
    }
}

#[tokio::test]
async fn a_busy_host_is_retried_with_a_doubling_backoff_up_to_its_cap() {
    let ran = run_call(chrono::Duration::hours(1), |n, _| {
        if n < 5 {
            Err(busy())
        } else {
            Ok(())
        }
    })
    .await;
    assert!(
        matches!(ran.result, Call::Done { .. }),
        "the sixth send is answered"
    );
    let gaps: Vec<Duration> = ran.sent.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps.len(), 5);
    for (gap, least) in gaps.iter().zip([20, 40, 80, 80, 80]) {
        assert!(*gap >= MS * least, "a backoff is never shorter: {gaps:?}");
    }
    // Without the cap the last wait would be 320 ms.
    assert!(
        gaps[4] < MS * 300,
        "the backoff stops doubling at its cap: {gaps:?}"
    );
    let outcomes: Vec<Option<AttemptOutcome>> = ran
        .engine
        .inner
        .store
        .attempts("ro_1")
        .await
        .expect("attempts")
        .into_iter()
        .map(|a| a.outcome)
        .collect();
    let mut expected = vec![Some(AttemptOutcome::Busy); 5];
    expected.push(None);
    assert_eq!(
        outcomes, expected,
        "every try is written ahead; the caller records the last"
    );
}

/// A call of the replica marks its rollout touched in the transaction of its first attempt
/// row: marked after a call that was sent (the mark is what a failure's rollback goes by),
/// not by a call aborted before anything was written or sent.
#[tokio::test]
async fn the_replica_is_marked_touched_with_the_first_attempt_and_not_before() {
    let touched = |ran: &Ran| {
        let store = ran.engine.inner.store.clone();
        async move {
            let r = store
                .get_rollout("ro_1")
                .await
                .expect("read")
                .expect("found");
            let attempts = store.attempts("ro_1").await.expect("attempts").len();
            (r.touched_replica, attempts)
        }
    };
    let ran = run_call(chrono::Duration::hours(1), |n, _| {
        if n < 2 {
            Err(busy())
        } else {
            Ok(())
        }
    })
    .await;
    assert!(matches!(ran.result, Call::Done { .. }));
    assert_eq!(touched(&ran).await, (true, 3), "marked with the attempts");

    let ran = run_call_aborted(true, chrono::Duration::hours(1), |_, _| Ok(())).await;
    assert!(matches!(ran.result, Call::Aborted));
    assert!(ran.sent.is_empty(), "nothing sent");
    assert_eq!(
        touched(&ran).await,
        (false, 0),
        "nothing written, not marked"
    );
}

#[tokio::test]
async fn a_busy_host_is_not_retried_past_the_step_deadline() {
    let ran = run_call(chrono::Duration::milliseconds(10), |_, _| Err(busy())).await;
    let Call::OutOfTime { last_error } = ran.result else {
        panic!("not out of time")
    };
    assert!(last_error.contains("compose_up"), "{last_error}");
    assert_eq!(
        ran.sent.len(),
        1,
        "a backoff longer than the time left is not waited"
    );
}

#[tokio::test]
async fn an_abort_during_the_backoff_stops_the_retries() {
    let ran = run_call(chrono::Duration::hours(1), |_, abort| {
        abort.cancel();
        Err(busy())
    })
    .await;
    assert!(matches!(ran.result, Call::Aborted));
    assert_eq!(ran.sent.len(), 1);
}

#[tokio::test]
async fn an_error_that_is_not_transient_is_not_retried() {
    let ran = run_call(chrono::Duration::hours(1), |_, _| {
        Err(ComposeError::InvalidRequest {
            message: "bad".into(),
        })
    })
    .await;
    assert!(matches!(ran.result, Call::Error { .. }));
    assert_eq!(ran.sent.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_pause_sleeps_its_whole_length_unless_an_abort_comes_first() {
    let abort = CancellationToken::new();
    let start = Instant::now();
    assert!(!pause(10 * SECOND, &abort).await, "not aborted");
    assert_on_grid(start.elapsed(), 10 * SECOND);

    let start = Instant::now();
    let aborter = tokio::spawn({
        let abort = abort.clone();
        async move {
            tokio::time::sleep(3 * SECOND).await;
            abort.cancel();
        }
    });
    assert!(pause(10 * SECOND, &abort).await, "aborted");
    assert_eq!(
        start.elapsed(),
        3 * SECOND,
        "the abort cuts the pause short"
    );
    aborter.await.expect("joined");

    let start = Instant::now();
    assert!(pause(10 * SECOND, &abort).await, "an abort already sent");
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// A long pause lasts its length, up to the next step of the 50 ms wake grid (and the timer's
/// millisecond).
fn assert_on_grid(slept: Duration, asked: Duration) {
    assert!(
        slept >= asked && slept <= asked + Duration::from_millis(51),
        "slept {slept:?} for a pause of {asked:?}"
    );
}

#[test]
fn a_wait_polls_a_tenth_of_the_time_left_between_50ms_and_1s() {
    let cases = [
        (chrono::Duration::hours(1), SECOND),
        (chrono::Duration::seconds(5), Duration::from_millis(500)),
        (
            chrono::Duration::milliseconds(100),
            Duration::from_millis(50),
        ),
        (chrono::Duration::seconds(-5), Duration::from_millis(50)),
    ];
    let now = Utc::now();
    for (left, expected) in cases {
        let got = poll_interval(now, now + left, &Default::default());
        assert_eq!(got, expected, "{left}");
    }
}
