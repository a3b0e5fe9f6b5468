use std::time::Duration;

use super::step::{Down, PeersHealthy, Plan, Smoke, Snapshot, Soak, Up, WaitHealth, WaitLogs};
use super::*;
use crate::domain::names::ServiceName;
use crate::domain::pattern::LogPattern;

const SHIPPED: &[(&str, &str, &str)] = &[
    (
        "runbooks/single-replica-canary.yaml",
        "single-replica-canary",
        include_str!("../../../runbooks/single-replica-canary.yaml"),
    ),
    (
        "runbooks/recreate-in-place.yaml",
        "recreate-in-place",
        include_str!("../../../runbooks/recreate-in-place.yaml"),
    ),
    (
        "runbooks/single-replica-rollback.yaml",
        "single-replica-rollback",
        include_str!("../../../runbooks/single-replica-rollback.yaml"),
    ),
    (
        "config/dev/runbooks/single-replica-canary.yaml",
        "single-replica-canary",
        include_str!("../../../config/dev/runbooks/single-replica-canary.yaml"),
    ),
    (
        "config/dev/runbooks/recreate-in-place.yaml",
        "recreate-in-place",
        include_str!("../../../config/dev/runbooks/recreate-in-place.yaml"),
    ),
    (
        "config/dev/runbooks/single-replica-rollback.yaml",
        "single-replica-rollback",
        include_str!("../../../config/dev/runbooks/single-replica-rollback.yaml"),
    ),
];

fn kinds(runbook: &Runbook) -> Vec<&'static str> {
    runbook.steps.iter().map(|s| s.kind.name()).collect()
}

#[test]
fn the_shipped_runbooks_parse_with_the_spec_sequences() {
    let canary = [
        "stage",
        "window",
        "snapshot",
        "peers_healthy",
        "plan",
        "down",
        "plan",
        "up",
        "verify_neighbours",
        "wait_health",
        "smoke",
        "wait_logs",
        "soak",
        "analyze",
    ];
    let recreate = [
        "stage",
        "window",
        "snapshot",
        "peers_healthy",
        "plan",
        "up",
        "verify_neighbours",
        "wait_health",
        "smoke",
        "wait_logs",
        "soak",
    ];
    for (file, name, text) in SHIPPED {
        let runbook = parse(name, file, text).unwrap_or_else(|e| panic!("{e}"));
        let expected: &[&str] = match *name {
            "single-replica-canary" => &canary,
            "recreate-in-place" => &recreate,
            // A rollback: no stage (the prior image is on the host), no window (it never
            // waits), no soak nor analysis.
            _ => &canary[2..12],
        };
        assert_eq!(kinds(&runbook), expected, "{file}");
        assert!(!runbook.description.is_empty(), "{file}");
        assert_eq!(runbook.ensure_safe(), Ok(()), "{file}");
    }
}

#[test]
fn production_runbooks_wait_for_a_cold_start_and_dev_copies_finish_in_seconds() {
    for (file, name, text) in SHIPPED {
        let runbook = parse(name, file, text).unwrap_or_else(|e| panic!("{e}"));
        let mut total = Duration::ZERO;
        let mut smoked = false;
        for step in &runbook.steps {
            match &step.kind {
                StepKind::WaitHealth(WaitHealth { timeout, .. })
                    if file.starts_with("runbooks/") =>
                {
                    assert_eq!(*timeout, Duration::from_secs(3600), "{file}");
                }
                StepKind::WaitLogs(WaitLogs {
                    forbid, require, ..
                }) => {
                    let forbid: Vec<&str> = forbid.iter().map(LogPattern::as_str).collect();
                    for line in [
                        "CUDA error 801",
                        "Traceback (most recent call last)",
                        "out of memory",
                    ] {
                        assert!(forbid.contains(&line), "{file}: {line}");
                    }
                    let requires_stall_dump = require
                        .iter()
                        .any(|p| p.as_str() == "event-loop stall dump armed");
                    assert_eq!(requires_stall_dump, *name != ROLLBACK, "{file}");
                }
                StepKind::Soak(Soak { duration, .. }) => total += *duration,
                StepKind::Smoke(Smoke {
                    model,
                    expect,
                    repeat,
                    timeout,
                    ..
                }) => {
                    smoked = true;
                    assert_eq!(model, "z-ai/glm-5.3-flash", "{file}: the served model id");
                    let expect: Vec<&str> = expect.iter().map(LogPattern::as_str).collect();
                    assert_eq!(expect, ["re:(?i)ready"], "{file}");
                    assert_eq!(*repeat, 2, "{file}: determinism is checked");
                    let want = if file.starts_with("runbooks/") {
                        120
                    } else {
                        5
                    };
                    assert_eq!(*timeout, Duration::from_secs(want), "{file}");
                }
                _ => {}
            }
        }
        assert!(smoked, "{file}: a smoke step");
        if file.starts_with("config/dev/") && *name != ROLLBACK {
            assert_eq!(total, Duration::from_secs(3), "{file}: dev soak");
        }
    }
}

#[test]
fn a_plan_steps_timeout_is_its_budget_so_a_rollbacks_wait_for_a_settled_host_can_be_shortened() {
    let yaml =
        "steps:\n  - {kind: peers_healthy}\n  - {name: preflight, kind: plan, timeout: 45s}\n";
    let runbook = parse("r", "r.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    let StepKind::Plan(plan) = &runbook.steps[1].kind else {
        panic!("a plan step: {:?}", runbook.steps[1].kind);
    };
    assert_eq!(plan.timeout, Duration::from_secs(45));
    assert_eq!(runbook.steps[1].kind.budget(), Duration::from_secs(45));
}

#[test]
fn omitted_fields_take_the_documented_defaults() {
    let yaml = "steps:\n  - {kind: snapshot}\n  - {kind: peers_healthy}\n  - {kind: plan}\n  - {kind: down}\n  - {kind: up}\n  - {kind: wait_health}\n  - {kind: wait_logs}\n  - {kind: soak}\n  - {kind: smoke, model: m, prompt: p}\n";
    let runbook = parse("r", "r.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    let m = |n: u64| Duration::from_secs(n * 60);
    let expected = vec![
        StepKind::Snapshot(Snapshot {}),
        StepKind::PeersHealthy(PeersHealthy { timeout: m(2) }),
        StepKind::Plan(Plan {
            allow: vec![],
            scope: Default::default(),
            timeout: m(5),
        }),
        StepKind::Down(Down {
            timeout: m(10),
            scope: Default::default(),
        }),
        StepKind::Up(Up {
            timeout: m(30),
            scope: Default::default(),
        }),
        StepKind::WaitHealth(WaitHealth {
            timeout: m(60),
            interval: Duration::from_secs(5),
            consecutive: 3,
        }),
        StepKind::WaitLogs(WaitLogs {
            timeout: m(30),
            interval: Duration::from_secs(5),
            require: vec![],
            forbid: vec![],
            max_log_failures: 3,
            service: None,
        }),
        StepKind::Soak(Soak {
            duration: m(10),
            interval: Duration::from_secs(5),
            max_misses: 3,
            forbid: vec![],
            max_log_failures: 3,
            watch: None,
        }),
        StepKind::Smoke(Smoke {
            model: "m".into(),
            prompt: "p".into(),
            max_tokens: 16,
            expect: vec![],
            repeat: 1,
            timeout: m(2),
        }),
    ];
    let got: Vec<StepKind> = runbook.steps.iter().map(|s| s.kind.clone()).collect();
    assert_eq!(got, expected);
    assert_eq!(
        runbook.steps[1].name, "peers_healthy",
        "a step is named after its kind by default"
    );
    assert_eq!(runbook.description, "");
}

const SAFE_HEAD: &str = "steps:\n  - {name: snap, kind: snapshot}\n  - {name: peers, kind: peers_healthy}\n  - {name: plan, kind: plan}\n";

#[test]
fn bad_runbooks_are_refused_with_the_line_and_the_step_named() {
    // (case, yaml, expected "line: message" fragment)
    let cases: &[(&str, String, &str)] = &[
        ("a field another kind takes", format!("{SAFE_HEAD}  - {{name: down, kind: down, interval: 5s}}\n  - {{name: up, kind: up}}\n"), "r.yaml:5: step 4 \"down\": unknown field `interval` (a `down` step takes: timeout, services)"),
        ("an unknown kind", format!("{SAFE_HEAD}  - {{name: x, kind: reboot}}\n"), "r.yaml:5: step 4 \"x\": unknown kind `reboot` (expected one of: free_space, snapshot, peers_healthy"),
        ("a field no kind takes, in block style", format!("{SAFE_HEAD}  - name: health\n    kind: wait_health\n    retries: 3\n"), "r.yaml:7: step 4 \"health\": unknown field `retries` (a `wait_health` step takes: timeout, interval, consecutive)"),
        ("a field on a kind that takes none", "steps:\n  - {name: s, kind: snapshot, timeout: 1m}\n".into(), "r.yaml:2: step 1 \"s\": unknown field `timeout` (a `snapshot` step takes: no other fields)"),
        ("a duration without a unit", format!("{SAFE_HEAD}  - name: health\n    kind: wait_health\n    timeout: 60\n"), "r.yaml:7: step 4 \"health\": `timeout`: invalid type: integer `60`, expected a duration such as `5s` or `45m`"),
        ("a fractional duration", format!("{SAFE_HEAD}  - {{name: soak, kind: soak, duration: 0.5m}}\n"), "r.yaml:5: step 4 \"soak\": `duration`: invalid duration `0.5m`"),
        ("a day unit", format!("{SAFE_HEAD}  - {{name: soak, kind: soak, duration: 1d}}\n"), "unknown unit `d`"),
        ("a zero timeout", "steps:\n  - {name: peers, kind: peers_healthy, timeout: 0s}\n".into(), "r.yaml:2: step 1 \"peers\": `timeout` must be longer than zero"),
        ("zero consecutive", "steps:\n  - {name: h, kind: wait_health, consecutive: 0}\n".into(), "r.yaml:2: step 1 \"h\": `consecutive` must be a whole number of at least 1, got `0`"),
        ("zero max_misses", "steps:\n  - {name: s, kind: soak, max_misses: 0}\n".into(), "step 1 \"s\": `max_misses` must be a whole number of at least 1"),
        ("an interval longer than the timeout", "steps:\n  - {name: h, kind: wait_health, timeout: 5s, interval: 1m}\n".into(), "step 1 \"h\": `interval` (1m) is longer than `timeout` (5s)"),
        ("a bad regex", "steps:\n  - name: logs\n    kind: wait_logs\n    require:\n      - ok\n    forbid: [\"re:(\"]\n".into(), "r.yaml:6: step 1 \"logs\": `forbid[0]`: invalid regular expression in `re:(`"),
        ("an empty pattern", "steps:\n  - {name: logs, kind: wait_logs, require: [\"\"]}\n".into(), "step 1 \"logs\": `require[0]`: empty log pattern"),
        ("patterns that are not a list", "steps:\n  - {name: logs, kind: wait_logs, require: \"x\"}\n".into(), "r.yaml:2: step 1 \"logs\": `require`: invalid type: string \"x\", expected a sequence"),
        ("a duplicate step name", format!("{SAFE_HEAD}  - {{name: plan, kind: plan}}\n"), "r.yaml:5: step 4 \"plan\": duplicate step name (also step 3)"),
        ("a missing kind", "steps:\n  - {name: x}\n".into(), "r.yaml:2: step 1: missing field `kind`"),
        ("a step that is not a mapping", "steps:\n  - snapshot\n".into(), "r.yaml:2: step 1: expected a mapping"),
        ("a bad step name", "steps:\n  - {name: \"my step\", kind: snapshot}\n".into(), "step 1: `name` must be 1 to 64 letters"),
        ("no steps", "description: x\nsteps: []\n".into(), "r.yaml:2: `steps` is empty"),
        ("no steps key", "description: x\n".into(), "r.yaml:1: missing field `steps`"),
        ("an unknown top-level key", "description: x\nname: y\nsteps: []\n".into(), "r.yaml:2: unknown field `name`"),
        ("broken YAML", "steps: [\n".into(), "r.yaml:2: did not find expected node content"),
        ("an empty file", "\n".into(), "r.yaml: empty runbook"),
        ("a smoke step without a model", "steps:\n  - {name: s, kind: smoke, prompt: hi}\n".into(), "r.yaml:2: step 1 \"s\": missing field `model` (the model id the engine serves, e.g. `z-ai/glm-5.3-flash`)"),
        ("a smoke step without a prompt", "steps:\n  - name: s\n    kind: smoke\n    model: m\n".into(), "r.yaml:2: step 1 \"s\": missing field `prompt` (the message sent to the engine)"),
        ("a blank smoke prompt", "steps:\n  - name: s\n    kind: smoke\n    model: m\n    prompt: \"  \"\n".into(), "r.yaml:5: step 1 \"s\": `prompt` must be a non-empty string (the message sent to the engine), got \"  \""),
        ("a smoke model that is a list", "steps:\n  - {name: s, kind: smoke, model: [a], prompt: p}\n".into(), "r.yaml:2: step 1 \"s\": `model`: invalid type: sequence, expected a string"),
        ("zero smoke repeats", "steps:\n  - name: s\n    kind: smoke\n    model: m\n    prompt: p\n    repeat: 0\n".into(), "r.yaml:6: step 1 \"s\": `repeat` must be a whole number of at least 1, got `0`"),
        ("negative max_tokens", "steps:\n  - {name: s, kind: smoke, model: m, prompt: p, max_tokens: -1}\n".into(), "step 1 \"s\": `max_tokens`: invalid value: integer `-1`, expected u32"),
        ("a bad smoke regex", "steps:\n  - name: s\n    kind: smoke\n    model: m\n    prompt: p\n    expect: [\"re:[\"]\n".into(), "r.yaml:6: step 1 \"s\": `expect[0]`: invalid regular expression in `re:[`"),
        ("a smoke timeout without a unit", "steps:\n  - {name: s, kind: smoke, model: m, prompt: p, timeout: 120}\n".into(), "step 1 \"s\": `timeout`: invalid type: integer `120`, expected a duration such as `5s` or `45m`"),
        ("a field smoke does not take", "steps:\n  - {name: s, kind: smoke, model: m, prompt: p, interval: 5s}\n".into(), "step 1 \"s\": unknown field `interval` (a `smoke` step takes: model, prompt, max_tokens, expect, repeat, timeout)"),
        ("a duplicate key", "steps:\n  - {name: a, kind: snapshot, kind: up}\n".into(), "r.yaml:2: steps[0]: duplicate entry with key \"kind\""),
    ];
    for (case, yaml, expected) in cases {
        let err = parse("r", "r.yaml", yaml).expect_err(case).to_string();
        assert!(
            err.contains(expected),
            "{case}:\n  got:      {err}\n  expected: {expected}"
        );
    }
}

#[test]
fn a_smoke_step_reads_every_field() {
    let yaml = "steps:\n  - name: smoke\n    kind: smoke\n    model: z-ai/glm-5.3-flash\n    prompt: Reply with the word ready.\n    max_tokens: 8\n    expect: [\"re:(?i)ready\", \"Ready\"]\n    repeat: 3\n    timeout: 90s\n";
    let runbook = parse("r", "r.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    let StepKind::Smoke(Smoke {
        model,
        prompt,
        max_tokens,
        expect,
        repeat,
        timeout,
    }) = &runbook.steps[0].kind
    else {
        panic!("{:?}", runbook.steps[0].kind);
    };
    assert_eq!(model, "z-ai/glm-5.3-flash");
    assert_eq!(prompt, "Reply with the word ready.");
    assert_eq!((*max_tokens, *repeat), (8, 3));
    assert_eq!(*timeout, Duration::from_secs(90));
    let expect: Vec<&str> = expect.iter().map(LogPattern::as_str).collect();
    assert_eq!(expect, ["re:(?i)ready", "Ready"]);
    assert!(!runbook.steps[0].kind.touches_replica());
    let json = serde_json::to_value(&runbook.steps[0]).expect("serialises");
    assert_eq!(
        json,
        serde_json::json!({"name": "smoke", "kind": "smoke", "model": "z-ai/glm-5.3-flash",
            "prompt": "Reply with the word ready.", "max_tokens": 8,
            "expect": ["re:(?i)ready", "Ready"], "repeat": 3, "timeout": "90s"})
    );
    let back: Step = serde_json::from_value(json).expect("deserialises");
    assert_eq!(back, runbook.steps[0]);
}

#[test]
fn companion_steps_parse_with_their_scope_and_a_companion_down_needs_no_later_up() {
    let yaml = "steps:\n  - {kind: peers_healthy}\n  - {name: plan-otel, kind: plan, services: [otelcol-contrib], force_recreate: true}\n  - {name: up-otel, kind: up, services: [otelcol-contrib], force_recreate: true}\n  - {name: plan-infra, kind: plan, services: [nginx, proxy-glm53], only_out_of_date: true}\n  - {name: up-infra, kind: up, services: [nginx, proxy-glm53], only_out_of_date: true}\n  - {name: down-check, kind: down, services: [glm53-perception-check]}\n";
    let runbook = parse("r", "r.yaml", yaml).expect("a companion runbook loads");
    let StepKind::Up(up) = &runbook.steps[2].kind else {
        panic!("up")
    };
    assert_eq!(up.scope.services, ["otelcol-contrib"]);
    assert!(up.scope.force_recreate && !up.scope.only_out_of_date);
    assert_eq!(runbook.steps[4].kind.companions(), ["nginx", "proxy-glm53"]);
    assert_eq!(
        runbook.steps[5].kind.companions(),
        ["glm53-perception-check"]
    );
    let json = serde_json::to_value(&runbook.steps[4]).expect("serialises");
    assert_eq!(
        json["services"],
        serde_json::json!(["nginx", "proxy-glm53"])
    );
    assert_eq!(json["only_out_of_date"], serde_json::json!(true));
    assert!(json.get("force_recreate").is_none());
    let back: Step = serde_json::from_value(json).expect("deserialises");
    assert_eq!(back, runbook.steps[4]);
    // A stored target step (before companions existed) still reads back.
    let old: Step =
        serde_json::from_value(serde_json::json!({"name": "up", "kind": "up", "timeout": "30m"}))
            .expect("old shape");
    assert!(old.kind.companions().is_empty());
}

#[test]
fn unsafe_orders_are_refused_naming_the_step() {
    let cases: &[(&str, &str, &str)] = &[
        ("up without a plan", "steps:\n  - {kind: peers_healthy}\n  - {name: go, kind: up}\n", "r.yaml:3: step 2 \"go\": an `up` step needs a `plan` step before it"),
        ("down before the peers check", "steps:\n  - {kind: plan}\n  - {kind: down}\n  - {kind: peers_healthy}\n  - {kind: up}\n", "r.yaml:3: step 2 \"down\": a `down` step needs a `peers_healthy` step before it"),
        ("up without any peers check", "steps:\n  - {kind: plan}\n  - {kind: up}\n", "step 2 \"up\": an `up` step needs a `peers_healthy` step"),
        ("a down that is never followed by an up", "steps:\n  - {kind: peers_healthy}\n  - {kind: down}\n", "step 2 \"down\": a `down` step needs an `up` step after it"),
        ("neighbours without a snapshot", "steps:\n  - {kind: verify_neighbours}\n", "step 1 \"verify_neighbours\": a `verify_neighbours` step needs a `snapshot` step before it"),
        ("a companion up gated only by the target's plan", "steps:\n  - {kind: peers_healthy}\n  - {kind: plan}\n  - {name: proxy, kind: up, services: [proxy-glm53]}\n", "step 3 \"proxy\": an `up` step needs a `plan` step before it (the dry-run gate) with the same scope (services [proxy-glm53]"),
        ("a companion up whose plan lacks its force_recreate", "steps:\n  - {kind: peers_healthy}\n  - {kind: plan, services: [otelcol-contrib]}\n  - {kind: up, services: [otelcol-contrib], force_recreate: true}\n", "step 3 \"up\": an `up` step needs a `plan` step before it"),
        ("a target up gated only by a companion plan", "steps:\n  - {kind: peers_healthy}\n  - {kind: plan, services: [nginx]}\n  - {kind: up}\n", "step 3 \"up\": an `up` step needs a `plan` step before it"),
        ("a target down followed only by a companion up", "steps:\n  - {kind: peers_healthy}\n  - {kind: plan, services: [nginx]}\n  - {kind: down}\n  - {kind: up, services: [nginx]}\n", "step 3 \"down\": a `down` step needs an `up` step after it"),
        ("force_recreate on the target", "steps:\n  - {kind: peers_healthy}\n  - {kind: plan}\n  - {kind: up, force_recreate: true}\n", "r.yaml:4: step 3 \"up\": `force_recreate: true` needs `services` (companion services): never on the target replica"),
        ("only_out_of_date on the target", "steps:\n  - {kind: plan, only_out_of_date: true}\n", "step 1 \"plan\": `only_out_of_date: true` needs `services`"),
        ("an empty companion list", "steps:\n  - {kind: peers_healthy}\n  - {kind: down, services: []}\n", "step 2 \"down\": `services` is empty"),
        ("a companion listed twice", "steps:\n  - {kind: plan, services: [nginx, nginx]}\n", "`services[1]` \"nginx\" is listed twice"),
        ("a list-like companion name", "steps:\n  - {kind: plan, services: [\"a,b\"]}\n", "r.yaml:2: step 1 \"plan\": `services[0]` \"a,b\" is not a compose service name"),
        ("an allowed name that is not a service", "steps:\n  - {kind: plan,\n     allow: [\"a b\"]}\n", "r.yaml:3: step 1 \"plan\": `allow[0]`: service must be exactly one compose service name (no commas or spaces), got \"a b\""),
        ("a wait_logs of a list", "steps:\n  - kind: wait_logs\n    require: [x]\n    service: \"a,b\"\n", "r.yaml:4: step 1 \"wait_logs\": `service`: service must be exactly one compose service name"),
        ("force_recreate on a down", "steps:\n  - {kind: peers_healthy}\n  - {kind: down, services: [nginx], force_recreate: true}\n", "unknown field `force_recreate` (a `down` step takes: timeout, services)"),
    ];
    for (case, yaml, expected) in cases {
        let err = parse("r", "r.yaml", yaml).expect_err(case).to_string();
        assert!(
            err.contains(expected),
            "{case}:\n  got:      {err}\n  expected: {expected}"
        );
    }
    let unsafe_runbook = Runbook {
        name: "r".into(),
        description: String::new(),
        steps: vec![Step {
            name: "up".into(),
            kind: StepKind::Up(Up {
                timeout: Duration::from_secs(1),
                scope: Default::default(),
            }),
        }],
    };
    let err = unsafe_runbook.ensure_safe().expect_err("no peers check");
    assert!(err.starts_with("step 1 \"up\":"), "{err}");
}

#[test]
fn kinds_have_stable_names_and_only_down_and_up_touch_the_replica() {
    let yaml = include_str!("../../../runbooks/single-replica-canary.yaml");
    let runbook = parse("c", "c.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    let touching: Vec<&str> = runbook
        .steps
        .iter()
        .filter(|s| s.kind.touches_replica())
        .map(|s| s.kind.name())
        .collect();
    assert_eq!(touching, ["down", "up"]);
    let mut names: Vec<&str> = runbook.steps.iter().map(|s| s.kind.name()).collect();
    names.sort_unstable();
    names.dedup();
    // The shipped canary runs unattended: a wait for a human (`approve`) is the one kind it
    // leaves to runbooks that want it, and a weights pre-stage's gate (`free_space`) is the
    // pre-stage runbook's.
    let mut all: Vec<&str> = StepKind::NAMES
        .iter()
        .copied()
        .filter(|k| *k != "approve" && *k != "free_space")
        .collect();
    all.sort_unstable();
    assert_eq!(names, all, "the canary uses every unattended kind");
    assert!(runbook.step_named("soak").is_some());
}

#[test]
fn a_runbook_round_trips_through_json_in_the_file_shape() {
    let yaml = include_str!("../../../runbooks/single-replica-canary.yaml");
    let runbook = parse("single-replica-canary", "c.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    let json = serde_json::to_value(&runbook).expect("serialises");
    assert_eq!(
        json["steps"][5],
        serde_json::json!({"name": "down", "kind": "down", "timeout": "10m"})
    );
    let back: Runbook = serde_json::from_value(json).expect("deserialises");
    assert_eq!(back, runbook);
}

#[test]
fn a_directory_loads_every_yaml_file_by_stem_and_stops_at_the_first_bad_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let good = "steps:\n  - {kind: snapshot}\n";
    std::fs::write(dir.path().join("a.yaml"), good).expect("write");
    std::fs::write(dir.path().join("b.yaml"), good).expect("write");
    std::fs::write(dir.path().join("notes.txt"), "not a runbook").expect("write");
    let loaded = load_dir(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(loaded["b"].name, "b");

    std::fs::write(dir.path().join("c.yaml"), "steps:\n  - {kind: nope}\n").expect("write");
    let err = load_dir(dir.path()).expect_err("bad file").to_string();
    assert!(
        err.contains("c.yaml:2: step 1 \"nope\": unknown kind `nope`"),
        "{err}"
    );

    let missing = dir.path().join("missing");
    let err = load_dir(&missing).expect_err("no dir").to_string();
    assert!(
        err.contains("missing: cannot read runbooks directory"),
        "{err}"
    );
}

#[test]
fn the_shipped_directories_load_whole() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped: &[&str] = &[
        "long-context-rollback",
        "long-context-rollout",
        "prestage-glm53-w4afp8",
        "recreate-in-place",
        DEFAULT_CANARY,
        ROLLBACK,
    ];
    let dev: &[&str] = &["recreate-in-place", DEFAULT_CANARY, ROLLBACK];
    for (dir, names) in [("runbooks", shipped), ("config/dev/runbooks", dev)] {
        let loaded = load_dir(&root.join(dir)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            loaded.keys().map(String::as_str).collect::<Vec<_>>(),
            names,
            "{dir}"
        );
    }
}

#[test]
fn the_long_context_runbooks_follow_procedure_a_and_its_rollback() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let loaded = load_dir(&root.join("runbooks")).unwrap_or_else(|e| panic!("{e}"));
    // (kind, companion services) of each step.
    let shape = |name: &str| -> Vec<(&'static str, Vec<String>)> {
        loaded[name]
            .steps
            .iter()
            .map(|s| {
                let companions = s.kind.companions().iter().map(|c| c.to_string());
                (s.kind.name(), companions.collect())
            })
            .collect()
    };
    let list = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let target = |kind: &'static str| (kind, Vec::new());
    let verification = list(&["glm53-soak-relay", "glm53-perception-check"]);
    let infra = list(&["proxy-glm53", "dcgm-glm53"]);
    let otel = list(&["otelcol-contrib"]);
    let head = [
        target("snapshot"),
        target("peers_healthy"),
        target("plan"),
        target("down"),
        target("plan"),
        target("up"),
        target("verify_neighbours"),
        target("wait_health"),
        target("smoke"),
        target("wait_logs"),
    ];
    // The rollout stages the new name's image and waits for a window first; the rollback
    // does neither.
    let mut rollout = vec![target("stage"), target("window")];
    rollout.extend(head.clone());
    rollout.extend([
        ("plan", list(&["glm53-soak-relay"])),
        ("up", list(&["glm53-soak-relay"])),
        ("plan", list(&["glm53-perception-check"])),
        ("up", list(&["glm53-perception-check"])),
        target("wait_logs"),
        ("plan", infra.clone()),
        ("up", infra.clone()),
        ("plan", otel.clone()),
        ("up", otel.clone()),
        target("soak"),
        target("analyze"),
        ("down", verification.clone()),
    ]);
    assert_eq!(shape("long-context-rollout"), rollout);
    let mut rollback = head.to_vec();
    rollback.extend([
        ("plan", infra.clone()),
        ("up", infra),
        ("plan", otel.clone()),
        ("up", otel),
        ("down", verification),
    ]);
    assert_eq!(shape("long-context-rollback"), rollback);
    let perception = loaded["long-context-rollout"]
        .steps
        .iter()
        .find(|s| s.name == "perception")
        .expect("the perception verdict step");
    let StepKind::WaitLogs(WaitLogs {
        service,
        require,
        forbid,
        ..
    }) = &perception.kind
    else {
        panic!("perception is a wait_logs step");
    };
    assert_eq!(service.as_deref(), Some("glm53-perception-check"));
    assert!(require.iter().any(|p| p.as_str().contains(r#""ok": true"#)));
    assert!(forbid.iter().any(|p| p.as_str().contains(r#""ok": false"#)));
    for name in ["long-context-rollout", "long-context-rollback"] {
        assert_eq!(loaded[name].ensure_safe(), Ok(()), "{name}");
        let forced: Vec<&Vec<ServiceName>> = loaded[name]
            .steps
            .iter()
            .filter_map(|s| s.kind.scope())
            .filter(|s| s.force_recreate)
            .map(|s| &s.services)
            .collect();
        assert!(
            forced
                .iter()
                .all(|s| s.len() == 1 && s[0] == "otelcol-contrib"),
            "{name}: {forced:?}"
        );
    }
}

#[test]
fn a_runbook_stored_as_json_before_the_kinds_had_their_own_modules_still_loads() {
    // The older stored shape of rollouts and tools (`StepKind` with inline fields).
    let stored = serde_json::json!({
        "name": "r", "description": "d",
        "steps": [
            {"name": "snapshot", "kind": "snapshot"},
            {"name": "peers", "kind": "peers_healthy", "timeout": "2m"},
            {"name": "plan", "kind": "plan", "allow": ["model-downloader"]},
            {"name": "down", "kind": "down", "timeout": "10m"},
            {"name": "up", "kind": "up", "timeout": "30m"},
            {"name": "neighbours", "kind": "verify_neighbours"},
            {"name": "health", "kind": "wait_health", "timeout": "1h", "interval": "5s", "consecutive": 3},
            {"name": "logs", "kind": "wait_logs", "timeout": "30m", "interval": "5s",
             "require": ["ready"], "forbid": ["re:CUDA error \\d+"], "max_log_failures": 3},
            {"name": "soak", "kind": "soak", "duration": "10m", "interval": "5s", "max_misses": 3,
             "forbid": [], "max_log_failures": 3},
            {"name": "smoke", "kind": "smoke", "model": "m", "prompt": "p", "max_tokens": 16,
             "expect": ["re:(?i)ready"], "repeat": 2, "timeout": "2m"}
        ]
    });
    let loaded: Runbook = serde_json::from_value(stored.clone()).expect("an old row loads");
    let yaml = "description: d\nsteps:\n  - {name: snapshot, kind: snapshot}\n  - {name: peers, kind: peers_healthy, timeout: 2m}\n  - {name: plan, kind: plan, allow: [model-downloader]}\n  - {name: down, kind: down}\n  - {name: up, kind: up}\n  - {name: neighbours, kind: verify_neighbours}\n  - {name: health, kind: wait_health, timeout: 60m}\n  - {name: logs, kind: wait_logs, require: [ready], forbid: ['re:CUDA error \\d+']}\n  - {name: soak, kind: soak}\n  - {name: smoke, kind: smoke, model: m, prompt: p, expect: ['re:(?i)ready'], repeat: 2}\n";
    let parsed = parse("r", "r.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded, parsed);
    // Written back, it says what an old row left implicit: a plan's timeout (5m).
    let mut written = stored;
    written["steps"][2]["timeout"] = "5m".into();
    assert_eq!(serde_json::to_value(&loaded).expect("serialises"), written);
}

#[test]
fn every_kind_is_registered_once_under_the_name_it_serialises_with() {
    let names: Vec<&str> = StepKindName::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(names, StepKind::NAMES);
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "a name is used twice");
    for kind in StepKindName::ALL {
        assert_eq!(kind.as_str().parse::<StepKindName>(), Ok(*kind));
        assert!(!kind.doc().is_empty(), "{kind}");
        let json = serde_json::to_value(kind).expect("serialises");
        assert_eq!(json, kind.as_str());
    }
    assert!("reboot".parse::<StepKindName>().is_err());
    let yaml = include_str!("../../../runbooks/single-replica-canary.yaml");
    let runbook = parse("c", "c.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    for step in &runbook.steps {
        let json = serde_json::to_value(&step.kind).expect("serialises");
        assert_eq!(
            json["kind"],
            step.kind.name(),
            "serde's name is the registered one"
        );
        assert!(step.kind.budget() > Duration::ZERO, "{}", step.name);
    }
}

#[test]
fn budgets_are_the_step_timeouts_and_quick_steps_get_five_minutes() {
    let yaml = include_str!("../../../runbooks/single-replica-canary.yaml");
    let runbook = parse("c", "c.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    let (s, m) = (Duration::from_secs, |n: u64| Duration::from_secs(n * 60));
    let expected = [
        ("stage", m(30)),
        ("window", m(24 * 60)),
        ("snapshot", m(5)),
        ("peers", m(2)),
        ("preflight", m(5)),
        ("down", m(10)),
        ("plan", m(5)),
        ("up", m(30)),
        ("neighbours", m(5)),
        ("health", m(60)),
        ("smoke", m(2)),
        ("startup-logs", m(60)),
        ("soak", m(10)),
        // warmup + duration + interval + a minute for a last slow scrape.
        ("analysis", m(10) + m(30) + s(30) + s(60)),
    ];
    let got: Vec<(&str, Duration)> = runbook
        .steps
        .iter()
        .map(|step| (step.name.as_str(), step.kind.budget()))
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn every_unknown_key_is_reported_at_once_in_file_order() {
    let yaml = "\
description: x
colour: blue
steps:
  - {name: snap, kind: snapshot, timeout: 1m}
  - {name: peers, kind: peers_healthy}
  - name: plan
    kind: plan
    retries: 3
    interval: 5s
owner: me
";
    let err = parse("r", "r.yaml", yaml)
        .expect_err("unknown keys")
        .to_string();
    let lines: Vec<&str> = err.lines().collect();
    let expected = [
        "r.yaml:2: unknown field `colour`",
        "r.yaml:4: step 1 \"snap\": unknown field `timeout` (a `snapshot` step takes: no other fields)",
        "r.yaml:8: step 3 \"plan\": unknown field `retries`",
        "r.yaml:9: step 3 \"plan\": unknown field `interval`",
        "r.yaml:10: unknown field `owner`",
    ];
    assert_eq!(lines.len(), expected.len(), "{err}");
    for (line, expected) in lines.iter().zip(expected) {
        assert!(
            line.starts_with(expected),
            "got {line}\nexpected {expected}\n{err}"
        );
    }
}

#[test]
fn every_field_a_kind_lists_is_one_serde_takes_and_any_other_is_refused() {
    for kind in StepKindName::ALL {
        // A mapping is no field's value: each listed field is refused for its value only.
        for field in kind.fields() {
            let yaml = format!("steps:\n  - {{kind: {kind}, {field}: {{x: 1}}}}\n");
            let err = parse("r", "r.yaml", &yaml).expect_err(field).to_string();
            // (A mapping field, `soak.watch`, refuses the mapping's own unknown key `x`.)
            assert!(
                !err.contains(&format!("unknown field `{field}`")),
                "{kind}.{field} is listed but serde refuses it: {err}"
            );
        }
        let yaml = format!("steps:\n  - {{kind: {kind}, zzz: 1}}\n");
        let err = parse("r", "r.yaml", &yaml).expect_err("zzz").to_string();
        let expected =
            format!("r.yaml:2: step 1 \"{kind}\": unknown field `zzz` (a `{kind}` step takes: ");
        assert!(err.starts_with(&expected), "{err}");
    }
}

#[test]
fn unknown_keys_of_an_analysis_check_are_reported_with_the_others() {
    let yaml = "\
colour: x
steps:
  - name: analysis
    kind: analyze
    timeout: 5m
    checks:
      - {name: t, counter: c, min: 1, limit: 2}
";
    let err = parse("r", "r.yaml", yaml)
        .expect_err("unknown keys")
        .to_string();
    let lines: Vec<&str> = err.lines().collect();
    let expected = [
        "r.yaml:1: unknown field `colour`",
        "r.yaml:5: step 1 \"analysis\": unknown field `timeout` (a `analyze` step takes: source,",
        "r.yaml:7: step 1 \"analysis\": `checks[0]`: unknown field `limit`, expected one of `name`,",
    ];
    assert_eq!(lines.len(), expected.len(), "{err}");
    for (line, expected) in lines.iter().zip(expected) {
        assert!(
            line.starts_with(expected),
            "got {line}\nexpected {expected}"
        );
    }
}

#[test]
fn a_field_left_empty_takes_its_default_and_an_unknown_one_is_still_refused() {
    let runbook = parse(
        "r",
        "r.yaml",
        "steps:\n  - {kind: wait_health, timeout: ~}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let StepKind::WaitHealth(health) = &runbook.steps[0].kind else {
        panic!("{:?}", runbook.steps[0].kind)
    };
    assert_eq!(health.timeout, defaults::WAIT_HEALTH_TIMEOUT);
    let err = parse("r", "r.yaml", "steps:\n  - {kind: snapshot, timeout: ~}\n")
        .expect_err("snapshot takes no timeout")
        .to_string();
    assert!(err.contains("unknown field `timeout`"), "{err}");
}

#[test]
fn unknown_keys_are_reported_even_when_another_field_of_the_step_is_wrong() {
    let yaml = "\
steps:
  - name: health
    kind: wait_health
    timeout: soon
    colour: blue
  - {name: plan, kind: plan, retries: 3}
";
    let err = parse("r", "r.yaml", yaml)
        .expect_err("unknown keys")
        .to_string();
    let lines: Vec<&str> = err.lines().collect();
    let expected = [
        "r.yaml:5: step 1 \"health\": unknown field `colour` (a `wait_health` step takes: ",
        "r.yaml:6: step 2 \"plan\": unknown field `retries`",
    ];
    assert_eq!(lines.len(), expected.len(), "{err}");
    for (line, expected) in lines.iter().zip(expected) {
        assert!(
            line.starts_with(expected),
            "got {line}\nexpected {expected}\n{err}"
        );
    }
    // Once the keys are fixed, the wrong value is what is left.
    let fixed = yaml
        .replace("    colour: blue\n", "")
        .replace(", retries: 3", "");
    let err = parse("r", "r.yaml", &fixed)
        .expect_err("bad timeout")
        .to_string();
    assert!(
        err.starts_with("r.yaml:4: step 1 \"health\": `timeout`"),
        "{err}"
    );
}
