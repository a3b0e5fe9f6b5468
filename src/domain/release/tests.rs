use super::*;

use RollbackPhase as R;
use TargetPhase as P;

fn t(host: &str, phase: TargetPhase) -> TargetView {
    TargetView {
        host: host.to_owned(),
        phase,
        rollback: R::None,
    }
}

fn rb(host: &str, phase: TargetPhase, rollback: RollbackPhase) -> TargetView {
    TargetView {
        host: host.to_owned(),
        phase,
        rollback,
    }
}

const HALT: ReleaseOnFailure = ReleaseOnFailure::Halt;
const ROLLBACK: ReleaseOnFailure = ReleaseOnFailure::RollbackRelease;

#[test]
fn the_canary_runs_alone_first() {
    let targets = [t("a", P::Waiting), t("a", P::Waiting), t("b", P::Waiting)];
    assert_eq!(decide(&targets, 5, HALT, false).start, vec![0]);
    let targets = [t("a", P::Running), t("a", P::Waiting), t("b", P::Waiting)];
    assert_eq!(decide(&targets, 5, HALT, false), Decision::default());
}

#[test]
fn after_the_canary_hosts_go_in_parallel_up_to_the_limit_one_target_per_host() {
    let targets = [
        t("a", P::Succeeded),
        t("a", P::Waiting),
        t("b", P::Waiting),
        t("b", P::Waiting),
        t("c", P::Waiting),
    ];
    assert_eq!(decide(&targets, 2, HALT, false).start, vec![1, 2]);
    assert_eq!(decide(&targets, 10, HALT, false).start, vec![1, 2, 4]);
    let targets = [
        t("a", P::Succeeded),
        t("a", P::Running),
        t("b", P::Succeeded),
        t("b", P::Waiting),
        t("c", P::Waiting),
    ];
    assert_eq!(decide(&targets, 2, HALT, false).start, vec![3]);
    assert_eq!(decide(&targets, 1, HALT, false).start, Vec::<usize>::new());
}

#[test]
fn paused_starts_nothing_but_a_done_release_still_ends() {
    let targets = [t("a", P::Succeeded), t("b", P::Waiting)];
    assert_eq!(decide(&targets, 2, HALT, true), Decision::default());
    let done = [t("a", P::Succeeded), t("b", P::Succeeded)];
    assert_eq!(
        decide(&done, 2, HALT, true).finish,
        Some(ReleaseStatus::Succeeded)
    );
}

#[test]
fn a_failure_starts_nothing_and_ends_failed_once_nothing_runs() {
    let targets = [
        t("a", P::Succeeded),
        t("b", P::Failed),
        t("c", P::Running),
        t("d", P::Waiting),
    ];
    assert_eq!(decide(&targets, 5, HALT, false), Decision::default());
    let targets = [
        t("a", P::Succeeded),
        t("b", P::Failed),
        t("c", P::Succeeded),
        t("d", P::Waiting),
    ];
    assert_eq!(
        decide(&targets, 5, HALT, false).finish,
        Some(ReleaseStatus::Failed)
    );
}

#[test]
fn rollback_release_undoes_succeeded_targets_newest_first_one_per_host() {
    let targets = [
        t("a", P::Succeeded),
        t("a", P::Succeeded),
        t("b", P::Succeeded),
        t("b", P::Failed),
        t("c", P::Waiting),
    ];
    let d = decide(&targets, 5, ROLLBACK, false);
    assert_eq!((d.roll_back, d.finish), (vec![2, 1], None));
    let targets = [
        rb("a", P::Succeeded, R::None),
        rb("a", P::Succeeded, R::Running),
        rb("b", P::Succeeded, R::Done),
        t("b", P::Failed),
    ];
    assert_eq!(decide(&targets, 5, ROLLBACK, false), Decision::default());
    let targets = [
        rb("a", P::Succeeded, R::Done),
        rb("a", P::Succeeded, R::Done),
        t("b", P::Failed),
    ];
    assert_eq!(
        decide(&targets, 5, ROLLBACK, false).finish,
        Some(ReleaseStatus::Failed)
    );
}

#[test]
fn controls_apply_only_where_they_make_sense() {
    use ReleaseControl as C;
    use ReleaseStatus as S;
    let cases = [
        (S::Running, C::Pause, Some(S::Paused)),
        (S::Pending, C::Pause, Some(S::Paused)),
        (S::Paused, C::Pause, None),
        (S::Paused, C::Resume, Some(S::Running)),
        (S::Running, C::Resume, None),
        (S::Running, C::Abort, Some(S::Aborted)),
        (S::Paused, C::Abort, Some(S::Aborted)),
        (S::Succeeded, C::Abort, None),
        (S::Failed, C::Pause, None),
        (S::Aborted, C::Resume, None),
    ];
    for (status, control, want) in cases {
        assert_eq!(status.after(control), want, "{status} {control}");
    }
}

#[test]
fn a_target_already_current_counts_as_done_and_lets_the_next_ones_start() {
    // The canary already at the release's tag: the rest proceed as after a success.
    let targets = [
        t("a", P::AlreadyCurrent),
        t("a", P::Waiting),
        t("b", P::Waiting),
    ];
    assert_eq!(decide(&targets, 2, HALT, false).start, vec![1, 2]);
    // It holds no host: the next target of its host starts.
    let targets = [
        t("a", P::Succeeded),
        t("b", P::AlreadyCurrent),
        t("b", P::Waiting),
    ];
    assert_eq!(decide(&targets, 1, HALT, false).start, vec![2]);
    let done = [t("a", P::AlreadyCurrent), t("b", P::Succeeded)];
    assert_eq!(
        decide(&done, 1, HALT, false).finish,
        Some(ReleaseStatus::Succeeded)
    );
    let all_current = [t("a", P::AlreadyCurrent), t("b", P::AlreadyCurrent)];
    assert_eq!(
        decide(&all_current, 1, HALT, true).finish,
        Some(ReleaseStatus::Succeeded)
    );
}

#[test]
fn rollback_release_leaves_a_target_already_current_alone() {
    // The release changed nothing there: nothing to undo.
    let targets = [
        t("a", P::AlreadyCurrent),
        t("a", P::Succeeded),
        t("b", P::Failed),
    ];
    let d = decide(&targets, 5, ROLLBACK, false);
    assert_eq!((d.roll_back, d.finish), (vec![1], None));
    let targets = [
        t("a", P::AlreadyCurrent),
        rb("a", P::Succeeded, R::Done),
        t("b", P::Failed),
    ];
    assert_eq!(
        decide(&targets, 5, ROLLBACK, false).finish,
        Some(ReleaseStatus::Failed)
    );
}

#[test]
fn a_target_not_started_is_never_started() {
    let targets = [t("a", P::Failed), t("b", P::NotStarted)];
    assert_eq!(
        decide(&targets, 5, HALT, false),
        Decision {
            finish: Some(ReleaseStatus::Failed),
            ..Decision::default()
        }
    );
    let targets = [t("a", P::Succeeded), t("b", P::NotStarted)];
    assert_eq!(decide(&targets, 5, HALT, false), Decision::default());
}

#[test]
fn every_outcome_has_its_phase() {
    use TargetOutcome as O;
    let cases = [
        (O::AlreadyCurrent, P::AlreadyCurrent, true),
        (O::NotStarted, P::NotStarted, false),
    ];
    for (outcome, phase, done) in cases {
        assert_eq!(TargetPhase::of_outcome(outcome), phase, "{outcome}");
        assert_eq!(phase.is_done(), done, "{outcome}");
    }
    assert!(P::Succeeded.is_done());
    for phase in [P::Waiting, P::Running, P::Failed] {
        assert!(!phase.is_done(), "{phase:?}");
    }
}
