use serde_json::{json, Value};

use super::*;

const R1: &str = "model-sg-glm53-w4afp8-tp4-r1";
const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";
const OLD_R2: &str = "model-sg-glm53-fp8-tp4-r2";
const OLD_R1: &str = "model-sg-glm53-fp8-tp4-r1";
const FILE: &str = "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml";

fn known() -> KnownTargets {
    KnownTargets {
        replicas: BTreeMap::from([(
            "gpu02".to_string(),
            BTreeSet::from([R1.to_string(), R2.to_string()]),
        )]),
        runbooks: ["single-replica-canary", "recreate-in-place"]
            .into_iter()
            .map(String::from)
            .collect(),
        aliases: BTreeMap::from([(
            "gpu02".to_string(),
            BTreeMap::from([
                (OLD_R2.to_string(), R2.to_string()),
                (OLD_R1.to_string(), R1.to_string()),
            ]),
        )]),
    }
}

/// The example plan of docs/reference.md#canary-plans.
fn example() -> Value {
    json!({
        "host": "gpu02",
        "file": FILE,
        "service": R2,
        "tag": "v0.0.452",
        "reason": "pin glm53-hicache-w4afp8-v3 on r2",
        "runbook": "single-replica-canary",
        "env": {"GLM53_HICACHE_RAM_BUDGET": "406GiB"},
        "require_logs": ["rank_budget_bytes=108984795136", "event-loop stall dump armed"],
        "on_failure": "rollback"
    })
}

fn submit(body: &Value) -> Result<CanaryPlan, PlanError> {
    let bytes = serde_json::to_vec(body).expect("serialises");
    validate(parse_json(&bytes)?, &known())
}

#[test]
fn the_spec_example_is_accepted_as_written() {
    let plan = submit(&example()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan.service, R2);
    assert_eq!(plan.runbook, "single-replica-canary");
    assert_eq!(plan.env["GLM53_HICACHE_RAM_BUDGET"], "406GiB");
    assert_eq!(plan.require_logs.len(), 2);
    assert_eq!(plan.on_failure, OnFailure::Rollback);
}

#[test]
fn omitted_optional_fields_take_their_defaults() {
    let body = json!({"host": "gpu02", "file": FILE, "service": R1, "tag": "v1", "reason": "  why  ",
                      "runbook": null, "env": null});
    let plan = submit(&body).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan.runbook, DEFAULT_CANARY);
    assert!(plan.env.is_empty() && plan.require_logs.is_empty());
    assert_eq!(plan.on_failure, OnFailure::Rollback);
    assert_eq!(plan.reason, "why");
}

#[test]
fn a_yaml_plan_reads_like_the_json_one() {
    let yaml = format!(
        "host: gpu02\nfile: {FILE}\nservice: {R2}\ntag: v0.0.452\nreason: pin v3 on r2\n\
         env:\n  GLM53_HICACHE_RAM_BUDGET: 406GiB\nrequire_logs:\n  - \"re:rank_budget_bytes=\\\\d+\"\non_failure: halt\n"
    );
    let plan = validate(
        parse_yaml(&yaml).unwrap_or_else(|e| panic!("{e}")),
        &known(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan.on_failure, OnFailure::Halt);
    assert_eq!(plan.require_logs[0].as_str(), "re:rank_budget_bytes=\\d+");
}

/// The example plan with one field replaced.
fn with(field: &str, value: Value) -> Value {
    let mut body = example();
    body[field] = value;
    body
}

/// The example plan without one field.
fn without(field: &str) -> Value {
    let mut body = example();
    body.as_object_mut().expect("object").remove(field);
    body
}

#[test]
#[rustfmt::skip]
fn every_spec_refusal_has_its_code_and_names_the_field() {
    // (case, body, code, field named at the start of the message, a word the message contains)
    let cases: Vec<(&str, Value, &str, &str, &str)> = vec![
        ("an unknown host", with("host", json!("gpu99")), "unknown_host", "host", "\"gpu99\" is not a configured host (configured: gpu02)"),
        ("a missing host", without("host"), "unknown_host", "host", "is required"),
        ("a service that is not a replica of the host", with("service", json!("nginx")), "unknown_service", "service", "\"nginx\" is not a configured replica of gpu02"),
        ("an empty service", with("service", json!("")), "invalid_service", "service", "must name one compose service"),
        ("a required free space without a unit", with("required_free", json!("300")), "invalid_size", "required_free", "is not a size"),
        ("a whitespace service", with("service", json!("   ")), "invalid_service", "service", "must name one compose service"),
        ("a service list", with("service", json!([R1, R2])), "invalid_service", "service", "expected a string (one replica name, not a list: a plan rolls exactly one replica)"),
        ("a service number", with("service", json!(2)), "invalid_service", "service", "invalid type: integer `2`, expected a string"),
        ("two services in one string", with("service", json!(format!("{R1},{R2}"))), "invalid_service", "service", "no commas or spaces"),
        ("a service with a space", with("service", json!("model r2")), "invalid_service", "service", "no commas or spaces"),
        ("a missing service", without("service"), "invalid_service", "service", "is required"),
        ("an absolute file", with("file", json!("/etc/passwd.yaml")), "invalid_file", "file", "relative"),
        ("a file outside prod/", with("file", json!("staging/x.yaml")), "invalid_file", "file", "under prod/"),
        ("a file climbing out", with("file", json!("prod/../secrets.yaml")), "invalid_file", "file", "`..`"),
        ("an empty file", with("file", json!("")), "invalid_file", "file", "prod/NAME.yaml"),
        ("a file that is not YAML", with("file", json!("prod/x.json")), "invalid_file", "file", ".yaml or .yml"),
        ("a file with an empty segment", with("file", json!("prod//x.yaml")), "invalid_file", "file", "empty or `.`"),
        ("a percent-encoded climb", with("file", json!("prod/%2e%2e/%2e%2e/attacker/repo/main/evil.yaml")), "invalid_file", "file", "percent-encoded"),
        ("a double-encoded climb", with("file", json!("prod/%252e%252e/evil.yaml")), "invalid_file", "file", "percent-encoded"),
        ("a backslash climb", with("file", json!("prod\\..\\evil.yaml")), "invalid_file", "file", "backslashes"),
        ("full-width dots", with("file", json!("prod/\u{ff0e}\u{ff0e}/evil.yaml")), "invalid_file", "file", "`._/-`"),
        ("a NUL in a file", with("file", json!("prod/a\u{0}.yaml")), "invalid_file", "file", "NUL or control"),
        ("a file from home", with("file", json!("~/x.yaml")), "invalid_file", "file", "relative"),
        ("an empty tag", with("tag", json!("")), "invalid_tag", "tag", "git tag"),
        ("a tag with a space", with("tag", json!("v1 v2")), "invalid_tag", "tag", "`._/-`"),
        ("a tag with a shell character", with("tag", json!("v1;rm")), "invalid_tag", "tag", "`._/-`"),
        ("a tag like an option", with("tag", json!("--force")), "invalid_tag", "tag", "must not start with `-`"),
        ("a tag that climbs out", with("tag", json!("../../etc/passwd")), "invalid_tag", "tag", "`..`"),
        ("a tag of two dots", with("tag", json!("..")), "invalid_tag", "tag", "`..`"),
        ("a tag with an empty part", with("tag", json!("a//b")), "invalid_tag", "tag", "`//`"),
        ("a tag like a lock file", with("tag", json!("x.lock")), "invalid_tag", "tag", "`.lock`"),
        ("a tag with a reflog suffix", with("tag", json!("v@{1}")), "invalid_tag", "tag", "`._/-`"),
        ("a tag starting with a slash", with("tag", json!("/v1")), "invalid_tag", "tag", "start or end with `/`"),
        ("a tag ending with a dot", with("tag", json!("v1.")), "invalid_tag", "tag", "end with `.`"),
        ("a hidden tag part", with("tag", json!("rel/.v1")), "invalid_tag", "tag", "start with `.`"),
        ("a 60,000-character tag", with("tag", json!("v".repeat(60_000))), "invalid_tag", "tag", "at most 128 bytes"),
        ("a 2,000-byte reason", with("reason", json!("r".repeat(2_000))), "invalid_body", "reason", "at most 1024 bytes"),
        ("a numeric tag in YAML", with("tag", json!(1.1)), "invalid_body", "tag", "quote it"),
        ("an env key with a dash", with("env", json!({"BAD-KEY": "x"})), "invalid_env", "env.BAD-KEY", "[A-Za-z_][A-Za-z0-9_]*"),
        ("an env key starting with a digit", with("env", json!({"1X": "x"})), "invalid_env", "env.1X", "key must match"),
        ("an env value with a newline", with("env", json!({"TOKEN": "a\nb"})), "invalid_env", "env.TOKEN", "newline"),
        ("an env value with a carriage return", with("env", json!({"TOKEN": "a\rb"})), "invalid_env", "env.TOKEN", "carriage return"),
        ("an env value that is a number", with("env", json!({"N": 1})), "invalid_env", "env.N", "expected a string (quote it in YAML)"),
        ("env as a list", with("env", json!(["A=1"])), "invalid_body", "env", "invalid type: sequence, expected a map"),
        ("an unknown runbook", with("runbook", json!("yolo")), "unknown_runbook", "runbook", "\"yolo\" is not a loaded runbook"),
        ("a missing reason", without("reason"), "missing_reason", "reason", "is required"),
        ("an empty reason", with("reason", json!("")), "missing_reason", "reason", "must say why"),
        ("a whitespace reason", with("reason", json!(" \n")), "missing_reason", "reason", "must say why"),
        ("a bad required-log regex", with("require_logs", json!(["ok", "re:("])), "invalid_pattern", "require_logs[1]", "invalid regular expression"),
        ("an empty required log", with("require_logs", json!([""])), "invalid_pattern", "require_logs[0]", "empty log pattern"),
        ("required logs as a string", with("require_logs", json!("x")), "invalid_body", "require_logs", "expected a sequence"),
        ("an unknown on_failure", with("on_failure", json!("retry")), "invalid_on_failure", "on_failure", "`rollback` or `halt`"),
        ("an unknown field", with("services", json!([R2])), "unknown_field", "services", "unknown field"),
        ("a force_recreate field", with("force_recreate", json!(true)), "unknown_field", "force_recreate", "expected one of"),
    ];
    for (case, body, code, field, words) in cases {
        let err = submit(&body).expect_err(case);
        assert_eq!(err.code, code, "{case}: {err}");
        assert_eq!(err.field.as_deref(), Some(field), "{case}: {err}");
        assert!(
            err.message.starts_with(&format!("{field}: ")),
            "{case}: {err}"
        );
        assert!(err.message.contains(words), "{case}: {err}");
    }
}

#[test]
fn malformed_bodies_are_refused_before_validation() {
    let big = format!("{{\"reason\": \"{}\"}}", "x".repeat(MAX_BODY_BYTES));
    let cases: Vec<(&str, Result<PlanSpec, PlanError>, &str, &str)> = vec![
        (
            "not JSON",
            parse_json(b"{host: gpu02"),
            "invalid_body",
            "not valid JSON",
        ),
        (
            "a JSON list",
            parse_json(b"[]"),
            "invalid_body",
            "must be an object",
        ),
        (
            "not YAML",
            parse_yaml("host: [\n"),
            "invalid_body",
            "not valid YAML",
        ),
        (
            "an empty YAML document",
            parse_yaml(""),
            "invalid_body",
            "got null",
        ),
        (
            "a YAML duplicate key",
            parse_yaml("host: a\nhost: b\n"),
            "invalid_body",
            "duplicate",
        ),
        (
            "a JSON duplicate key",
            parse_json(br#"{"host": "gpu02", "host": "gpu03"}"#),
            "invalid_body",
            "duplicate field `host`",
        ),
        (
            "a JSON duplicate key deeper down",
            parse_json(br#"{"host": "gpu02", "require_logs": [{"a": 1, "a": 2}]}"#),
            "invalid_body",
            "duplicate field `require_logs[0].a`",
        ),
        (
            "over 64 KiB",
            parse_json(big.as_bytes()),
            "body_too_large",
            "the limit is 65536",
        ),
    ];
    for (case, result, code, words) in cases {
        let err = result.expect_err(case);
        assert_eq!(err.code, code, "{case}: {err}");
        assert!(err.message.contains(words), "{case}: {err}");
        assert!(!err.is_unprocessable(), "{case}: a malformed body is a 400");
    }
}

#[test]
fn semantic_refusals_are_unprocessable_and_shape_problems_are_bad_requests() {
    let semantic = submit(&with("host", json!("gpu99"))).expect_err("unknown host");
    assert!(semantic.is_unprocessable());
    let shape = submit(&with("extra", json!(1))).expect_err("unknown field");
    assert!(!shape.is_unprocessable());
    let err = submit(&with("env", json!({"TOKEN": "secret\nvalue"}))).expect_err("newline");
    assert!(
        !err.message.contains("secret"),
        "env values are never echoed: {err}"
    );
}

#[test]
fn a_plan_spec_built_by_the_cli_serialises_without_absent_fields() {
    let spec = PlanSpec {
        windows: None,
        required_free: None,
        host: "gpu02".into(),
        file: FILE.into(),
        service: R2.into(),
        tag: "v1".into(),
        reason: "r".into(),
        runbook: None,
        env: None,
        require_logs: None,
        on_failure: Some(OnFailure::Halt),
        replaces: None,
    };
    let json = serde_json::to_value(&spec).expect("serialises");
    assert_eq!(json.as_object().map(|o| o.len()), Some(6));
    let back =
        parse_json(&serde_json::to_vec(&json).expect("bytes")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, spec);
}

#[test]
fn replaces_names_a_former_name_of_the_target_and_defaults_its_file_and_tag() {
    let mut plan = example();
    plan["replaces"] = json!({"service": OLD_R2});
    let ok = submit(&plan).unwrap_or_else(|e| panic!("{e}"));
    let r = ok.replaces.expect("replaces kept");
    assert_eq!((r.service.as_str(), r.file, r.tag), (OLD_R2, None, None));
    plan["replaces"] = json!({"service": OLD_R2, "file": FILE, "tag": "v0.0.451"});
    let r = submit(&plan).unwrap_or_else(|e| panic!("{e}")).replaces;
    assert_eq!(r.and_then(|r| r.tag).as_deref(), Some("v0.0.451"));
}

#[test]
fn a_bad_replaces_is_refused_naming_the_field() {
    let cases: Vec<(Value, &str, &str, &str)> = vec![
        (
            json!({"service": R2}),
            "invalid_replaces",
            "replaces.service",
            "the target itself",
        ),
        (
            json!({"service": R1}),
            "invalid_replaces",
            "replaces.service",
            "another replica",
        ),
        (
            json!({"service": OLD_R1}),
            "invalid_replaces",
            "replaces.service",
            "former name of model-sg-glm53-w4afp8-tp4-r1",
        ),
        (
            json!({"service": "model-x"}),
            "invalid_replaces",
            "replaces.service",
            "not a configured former name",
        ),
        (
            json!({"service": "a b"}),
            "invalid_replaces",
            "replaces.service",
            "exactly one",
        ),
        (
            json!({"service": ""}),
            "invalid_replaces",
            "replaces.service",
            "must name one",
        ),
        (
            json!({"service": OLD_R2, "file": "../x.yaml"}),
            "invalid_replaces",
            "replaces.file",
            "..",
        ),
        (
            json!({"service": OLD_R2, "tag": "v 1"}),
            "invalid_replaces",
            "replaces.tag",
            "letters",
        ),
        (
            json!({"service": OLD_R2, "other": 1}),
            "invalid_body",
            "replaces",
            "unknown field",
        ),
        (
            json!({"file": FILE}),
            "invalid_body",
            "replaces",
            "missing field `service`",
        ),
        (
            json!("old"),
            "invalid_body",
            "replaces",
            "invalid type: string",
        ),
    ];
    for (replaces, code, field, says) in cases {
        let mut plan = example();
        plan["replaces"] = replaces.clone();
        let err = submit(&plan).expect_err("refused");
        assert_eq!(
            (err.code, err.field.as_deref()),
            (code, Some(field)),
            "{replaces}: {err}"
        );
        assert!(err.message.starts_with(field), "{err}");
        assert!(err.message.contains(says), "{replaces}: {err}");
    }
}

#[test]
fn a_json_env_key_given_twice_is_refused_naming_it_not_kept_once() {
    let err = parse_json(br#"{"host": "gpu02", "env": {"TOKEN": "a", "TOKEN": "b"}}"#)
        .expect_err("refused");
    assert_eq!(err.code, "invalid_env");
    assert!(err.is_unprocessable());
    assert_eq!(err.field.as_deref(), Some("env.TOKEN"));
    assert_eq!(err.message, "env.TOKEN: given twice");
}

#[test]
fn a_yaml_plan_flattened_by_curl_d_says_to_send_it_with_data_binary() {
    let err = parse_yaml("host: gpu02 file: prod/x.yaml service: r2 tag: v1 reason: r")
        .expect_err("one line of YAML mappings is refused");
    assert_eq!(err.code, "invalid_body");
    assert!(
        err.message.contains("--data-binary @plan.yaml"),
        "{}",
        err.message
    );
    let err = parse_yaml("host: [").expect_err("refused");
    assert!(!err.message.contains("--data-binary"), "{}", err.message);
}

#[test]
fn every_unknown_key_is_named_at_once_in_the_order_written() {
    // serde_json sorts an object's keys: `zone` would come after `servce` and `tga`.
    let json = br#"{"host": "gpu02", "zone": 1, "file": "f.yml", "tga": "v1", "servce": "x"}"#;
    let err = parse_json(json).expect_err("unknown keys");
    assert_eq!(err.code, "unknown_field");
    assert_eq!(err.field.as_deref(), Some("zone"));
    assert!(
        err.message
            .starts_with("zone, tga, servce: unknown fields (expected one of `host`,"),
        "{err}"
    );
    let yaml = "zone: 1\nhost: gpu02\ntga: v1\nservce: x\n";
    let err = parse_yaml(yaml).expect_err("unknown keys");
    assert!(
        err.message.starts_with("zone, tga, servce: unknown fields"),
        "{err}"
    );
    let one = parse_yaml("host: gpu02\ntga: v1\n").expect_err("one unknown key");
    assert!(
        one.message
            .starts_with("tga: unknown field (expected one of `host`"),
        "{one}"
    );
}
