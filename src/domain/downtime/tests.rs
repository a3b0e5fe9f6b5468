use chrono::{DateTime, Duration, Utc};

use super::{of, DowntimeParts, StepTimes};
use crate::domain::runbook::StepKindName;

fn t(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + s, 0).expect("a time")
}

fn step(kind: StepKindName, on_replica: bool, calls: &[(&str, i64, Option<i64>)]) -> StepTimes {
    StepTimes {
        kind,
        on_replica,
        calls: calls
            .iter()
            .map(|(e, sent, ended)| (e.to_string(), t(*sent), ended.map(t)))
            .collect(),
        healthy_since: None,
        pulled_at: None,
    }
}

fn health(since: Option<i64>) -> StepTimes {
    StepTimes {
        healthy_since: since.map(t),
        ..step(StepKindName::WaitHealth, true, &[])
    }
}

/// (case, steps, (down_at, back_at) in seconds, parts).
type Case = (
    &'static str,
    Vec<StepTimes>,
    Option<(i64, Option<i64>)>,
    DowntimeParts,
);

#[test]
fn the_downtime_runs_from_the_replicas_down_to_its_first_healthy_answer_in_parts() {
    use StepKindName::{Down, Plan, Up};
    let s = Duration::seconds(1).num_milliseconds();
    let plan = step(Plan, true, &[("compose/up?dry_run", 0, Some(2))]);
    let cases: Vec<Case> = vec![
        (
            "no down sent",
            vec![plan.clone()],
            None,
            DowntimeParts::default(),
        ),
        (
            "a canary: down 10 s, up 60 s (pull 45 s, create), cold start 1,200 s",
            vec![
                plan.clone(),
                step(Down, true, &[("compose/down", 10, Some(20))]),
                StepTimes {
                    pulled_at: Some(t(66)),
                    ..step(Up, true, &[("compose/up", 21, Some(81))])
                },
                health(Some(1281)),
            ],
            Some((10, Some(1281))),
            DowntimeParts {
                down_ms: Some(10 * s),
                between_ms: Some(s),
                up_ms: Some(60 * s),
                pull_ms: Some(45 * s),
                cold_start_ms: Some(1200 * s),
            },
        ),
        (
            "a companion's down first is not the replica's",
            vec![
                step(Down, false, &[("compose/down", 1, Some(2))]),
                step(Down, true, &[("compose/down", 10, Some(20))]),
                step(Up, false, &[("compose/up", 21, Some(22))]),
                step(Up, true, &[("compose/up", 30, Some(40))]),
                health(Some(100)),
            ],
            Some((10, Some(100))),
            DowntimeParts {
                down_ms: Some(10 * s),
                between_ms: Some(10 * s),
                up_ms: Some(10 * s),
                pull_ms: None,
                cold_start_ms: Some(60 * s),
            },
        ),
        (
            "still cold: no healthy answer yet",
            vec![
                step(Down, true, &[("compose/down", 10, Some(20))]),
                step(Up, true, &[("compose/up", 21, Some(81))]),
                health(None),
            ],
            Some((10, None)),
            DowntimeParts {
                down_ms: Some(10 * s),
                between_ms: Some(s),
                up_ms: Some(60 * s),
                pull_ms: None,
                cold_start_ms: None,
            },
        ),
        (
            "a down of unknown outcome and no up: out since the down, nothing more known",
            vec![
                step(Down, true, &[("compose/down", 10, None)]),
                health(Some(50)),
            ],
            Some((10, None)),
            DowntimeParts::default(),
        ),
    ];
    for (case, steps, want, parts) in cases {
        let got = of(&steps);
        let (down_at, back_at) = match want {
            None => {
                assert_eq!(got, None, "{case}");
                continue;
            }
            Some(w) => w,
        };
        let got = got.unwrap_or_else(|| panic!("{case}: a downtime"));
        assert_eq!(got.down_at, t(down_at), "{case}");
        assert_eq!(got.back_at, back_at.map(t), "{case}");
        assert_eq!(got.total_ms, back_at.map(|b| (b - down_at) * s), "{case}");
        assert_eq!(got.parts, parts, "{case}");
        if let Some(total) = got.total_ms {
            let p = &got.parts;
            let sum: i64 = [p.down_ms, p.between_ms, p.up_ms, p.cold_start_ms]
                .iter()
                .flatten()
                .sum();
            assert_eq!(sum, total, "{case}: the parts add up");
        }
    }
}
