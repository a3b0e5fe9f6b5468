use super::*;
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
fn next_reads_the_stored_steps_as_the_table_says() {
    let cases: &[(&str, &[StepStatus], Next)] = &[
        ("the first step", &[S::Pending, S::Pending], Next::Turn(0)),
        ("after a success", &[S::Succeeded, S::Pending], Next::Turn(1)),
        ("a resumed running step", &[S::Succeeded, S::Running, S::Pending], Next::Turn(1)),
        ("past a skipped step", &[S::Skipped, S::Pending], Next::Turn(1)),
        ("an aborted step whose rollout was not", &[S::Succeeded, S::Aborted], Next::Turn(1)),
        ("a recorded failure", &[S::Succeeded, S::Failed, S::Pending], Next::FinishFailed(1)),
        ("every step done", &[S::Succeeded, S::Skipped], Next::Succeed),
        ("no steps", &[], Next::Succeed),
    ];
    for (case, steps, expected) in cases {
        assert_eq!(next(steps), *expected, "{case}");
    }
}

#[test]
fn next_holds_its_rules_for_every_list_of_three_steps() {
    let done = |s: &StepStatus| matches!(s, S::Succeeded | S::Skipped);
    let mut seen = 0;
    for steps in every_step_list(3) {
        seen += 1;
        let got = next(&steps);
        let case = format!("{steps:?}: {got:?}");
        match got {
            Next::FinishFailed(i) => {
                assert!(
                    steps[..i].iter().all(done) && steps[i] == S::Failed,
                    "{case}"
                );
            }
            Next::Turn(i) => {
                assert!(steps[..i].iter().all(done), "{case}");
                assert!(
                    matches!(steps[i], S::Pending | S::Running | S::Aborted),
                    "{case}"
                );
            }
            Next::Succeed => assert!(steps.iter().all(done), "{case}"),
        }
    }
    assert_eq!(seen, 1 + 6 + 36 + 216);
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
fn an_interruption_pauses_only_a_stopping_daemon_with_no_abort_requested() {
    let table = [
        (false, false, Interrupted::Abort),
        (false, true, Interrupted::Abort),
        (true, false, Interrupted::Pause),
        (true, true, Interrupted::Abort),
    ];
    for (stopping, abort_requested, expected) in table {
        assert_eq!(
            interrupted(stopping, abort_requested),
            expected,
            "stopping={stopping} abort={abort_requested}"
        );
    }
}
