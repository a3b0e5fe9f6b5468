use super::*;
use RolloutStatus as R;
use StepStatus as S;

/// Every list of step statuses up to `len` long.
fn every_step_list(len: usize) -> Vec<Vec<StepStatus>> {
    let mut lists = vec![Vec::new()];
    let mut last = vec![Vec::new()];
    for _ in 0..len {
        last = last
            .iter()
            .flat_map(|l: &Vec<StepStatus>| {
                S::ALL.iter().map(move |s| {
                    let mut longer = l.clone();
                    longer.push(*s);
                    longer
                })
            })
            .collect();
        lists.extend(last.iter().cloned());
    }
    lists
}

#[test]
#[rustfmt::skip]
fn next_reads_the_stored_rollout_as_the_table_says() {
    let cases: &[(&str, RolloutStatus, &[StepStatus], bool, Next)] = &[
        ("an ended rollout", R::Succeeded, &[S::Succeeded], true, Next::Done),
        ("a failed one, even with a step left running", R::Failed, &[S::Running], true, Next::Done),
        ("an aborted one", R::Aborted, &[S::Pending], false, Next::Done),
        ("a pending rollout starts", R::Pending, &[S::Pending, S::Pending], true, Next::Start),
        ("a pending one starts even unconfigured", R::Pending, &[S::Pending], false, Next::Start),
        ("the first step", R::Running, &[S::Pending, S::Pending], true, Next::Turn(0)),
        ("after a success", R::Running, &[S::Succeeded, S::Pending], true, Next::Turn(1)),
        ("a resumed running step", R::Running, &[S::Succeeded, S::Running, S::Pending], true, Next::Turn(1)),
        ("past a skipped step", R::Running, &[S::Skipped, S::Pending], true, Next::Turn(1)),
        ("an aborted step whose rollout was not", R::Running, &[S::Succeeded, S::Aborted], true, Next::Turn(1)),
        ("a recorded failure", R::Running, &[S::Succeeded, S::Failed, S::Pending], true, Next::FinishFailed(1)),
        ("every step done", R::Running, &[S::Succeeded, S::Skipped], true, Next::Succeed),
        ("no steps", R::Running, &[], true, Next::Succeed),
        ("unconfigured, a step left", R::Running, &[S::Succeeded, S::Pending], false, Next::Unconfigured { current: Some(1) }),
        ("unconfigured, the failed step is finished", R::Running, &[S::Failed, S::Pending], false, Next::Unconfigured { current: Some(1) }),
        ("unconfigured, nothing left", R::Running, &[S::Succeeded], false, Next::Unconfigured { current: None }),
    ];
    for (case, status, steps, configured, expected) in cases {
        assert_eq!(next(*status, steps, *configured), *expected, "{case}");
    }
}

#[test]
fn next_holds_its_rules_for_every_status_and_every_list_of_three_steps() {
    let done = |s: &StepStatus| matches!(s, S::Succeeded | S::Skipped);
    let mut seen = 0;
    for status in R::ALL {
        for steps in every_step_list(3) {
            for configured in [true, false] {
                seen += 1;
                let got = next(*status, &steps, configured);
                let case = format!("{status:?} {steps:?} configured={configured}: {got:?}");
                match got {
                    Next::Done => assert!(status.is_terminal(), "{case}"),
                    Next::Start => assert_eq!(*status, R::Pending, "{case}"),
                    Next::Unconfigured { current } => {
                        assert!(!configured && *status == R::Running, "{case}");
                        assert_eq!(
                            current,
                            steps.iter().position(|s| !s.is_terminal()),
                            "{case}"
                        );
                    }
                    Next::FinishFailed(i) => {
                        assert!(configured && *status == R::Running, "{case}");
                        assert!(
                            steps[..i].iter().all(done) && steps[i] == S::Failed,
                            "{case}"
                        );
                    }
                    Next::Turn(i) => {
                        assert!(configured && *status == R::Running, "{case}");
                        assert!(steps[..i].iter().all(done), "{case}");
                        assert!(
                            matches!(steps[i], S::Pending | S::Running | S::Aborted),
                            "{case}"
                        );
                    }
                    Next::Succeed => {
                        assert!(configured && *status == R::Running, "{case}");
                        assert!(steps.iter().all(done), "{case}");
                    }
                }
            }
        }
    }
    assert_eq!(seen, R::ALL.len() * (1 + 6 + 36 + 216) * 2);
}

#[test]
fn turn_puts_an_abort_before_a_shutdown_before_a_changed_runbook() {
    for abort_requested in [false, true] {
        for stopping in [false, true] {
            for in_runbook in [false, true] {
                for status in S::ALL {
                    for started_with_previous in [false, true] {
                        let facts = TurnFacts {
                            abort_requested,
                            stopping,
                            in_runbook,
                            status: *status,
                            started_with_previous,
                        };
                        let expected = if abort_requested {
                            Turn::Abort
                        } else if stopping {
                            Turn::Pause
                        } else if !in_runbook {
                            Turn::NotInRunbook
                        } else {
                            let resumed = *status == S::Running && !started_with_previous;
                            Turn::Run { resumed }
                        };
                        assert_eq!(turn(facts), expected, "{facts:?}");
                    }
                }
            }
        }
    }
}

#[test]
#[rustfmt::skip]
fn after_is_the_whole_table_of_ends() {
    let table = [
        (Ended::Succeeded, false, false, After::Continue),
        (Ended::Succeeded, false, true, After::Continue),
        (Ended::Succeeded, true, false, After::Continue),
        (Ended::Succeeded, true, true, After::Continue),
        (Ended::Failed, false, false, After::Fail),
        (Ended::Failed, false, true, After::Fail),
        (Ended::Failed, true, false, After::Fail),
        (Ended::Failed, true, true, After::Fail),
        (Ended::Interrupted, false, false, After::Abort),
        (Ended::Interrupted, false, true, After::Abort),
        (Ended::Interrupted, true, false, After::Pause),
        (Ended::Interrupted, true, true, After::Abort),
    ];
    for (ended, stopping, abort_requested, expected) in table {
        assert_eq!(after(ended, stopping, abort_requested), expected, "{ended:?} stopping={stopping} abort={abort_requested}");
    }
}
