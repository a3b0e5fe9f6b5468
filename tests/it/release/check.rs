//! `canaryd check release FILE`: a release file checked against a config as `POST
//! /v1/releases` would check it, without a daemon; `file:line: message (code)` on a refusal.

use std::process::Command;

use crate::helpers::{FILE, HOST, R1, R2};

/// `canaryd check release FILE --config <the shipped config>` with its env vars set to
/// placeholders: (exit code, stdout, stderr).
fn check_release(text: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("release.yaml");
    std::fs::write(&path, text).expect("write");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_canaryd"));
    cmd.args(["check", "release"]).arg(&path).args(extra);
    if !extra.contains(&"--no-config") {
        cmd.arg("--config").arg(format!(
            "{}/config/canaryd.yaml",
            env!("CARGO_MANIFEST_DIR")
        ));
    }
    for var in [
        "CANARYD_TOKEN_OPS_ALICE",
        "CANARYD_TOKEN_ONCALL",
        "CANARYD_TOKEN_AUDIT",
        "GPU02_COMPOSE_MANAGER_TOKEN",
    ] {
        cmd.env(var, format!("placeholder-{var}"));
    }
    let out = cmd.output().expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn release(targets: &str) -> String {
    format!(
        "file: {FILE}\ntag: v0.0.452\nreason: promote v0.0.452\nmax_parallel_hosts: 1\n{targets}"
    )
}

#[test]
fn a_release_file_naming_configured_replicas_passes_and_is_summarised() {
    let text = release(&format!(
        "targets:\n  - {{host: {HOST}, service: {R2}}}\n  - {{host: {HOST}, service: {R1}}}\ncanary: {{host: {HOST}, service: {R1}}}\n"
    ));
    let (code, out, err) = check_release(&text, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(&format!("ok (2 target(s) to v0.0.452, canary {HOST}/{R1}")),
        "the canary named, as the API would order it: {out}"
    );
    let selector = release(&format!(
        "selector: {{hosts: [{HOST}], group: glm53-long}}\n"
    ));
    let (code, out, err) = check_release(&selector, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(&format!("canary {HOST}/{R2}")),
        "r2 first: {out}"
    );
}

#[test]
fn a_release_file_naming_an_unknown_host_or_replica_fails_with_its_line_and_exits_one() {
    let cases = [
        (
            release(&format!(
                "targets:\n  - {{host: {HOST}, service: {R2}}}\n  - {{host: gpu09, service: {R1}}}\n"
            )),
            format!("release.yaml:7: targets[1] (gpu09/{R1}): "),
        ),
        (
            release(&format!(
                "targets:\n  - {{host: {HOST}, service: {R2}}}\n  - {{host: {HOST}, service: no-such-replica}}\n"
            )),
            format!("release.yaml:7: targets[1] ({HOST}/no-such-replica): "),
        ),
        (
            release(&format!(
                "selector:\n  hosts: [{HOST}, gpu09]\n  group: glm53-long\n"
            )),
            "release.yaml:6: selector.hosts[1]: \"gpu09\" is not a configured host (unknown_host)"
                .to_owned(),
        ),
        (
            release(&format!(
                "targets:\n  - {{host: {HOST}, service: {R2}}}\ncanary: {{host: {HOST}, service: {R1}}}\n"
            )),
            format!("release.yaml:7: canary ({HOST}/{R1}): must be one of the targets (invalid_release)"),
        ),
        (
            release("targets: []\ncolour: red\n"),
            "release.yaml:6: unknown field `colour`".to_owned(),
        ),
    ];
    for (text, want) in cases {
        let (code, _, err) = check_release(&text, &[]);
        assert_eq!(code, Some(1), "{text}: {err}");
        assert!(err.contains(&want), "{want:?} in {err}");
    }
}

#[test]
fn no_config_checks_only_the_release_file_syntax_and_says_so() {
    let text = release("targets:\n  - {host: gpu09, service: anything}\n");
    let (code, out, err) = check_release(&text, &["--no-config"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("syntax ok"), "{out}");
}
