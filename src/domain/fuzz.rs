//! Property tests (proptest) of the parsers that read untrusted text: canary plans (JSON and
//! YAML bodies of `POST /v1/rollouts`) and runbooks. They must never panic, and what they
//! accept must satisfy the documented invariants. See docs/fuzzing.md.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::plan::{parse_json, parse_yaml, validate, KnownTargets};
use super::runbook;

const R1: &str = "model-sg-glm53-w4afp8-tp4-r1";
const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";

fn known() -> KnownTargets {
    KnownTargets {
        replicas: BTreeMap::from([(
            "gpu02".to_owned(),
            BTreeSet::from([R1.to_owned(), R2.to_owned()]),
        )]),
        runbooks: BTreeSet::from(["single-replica-canary".to_owned()]),
        aliases: BTreeMap::new(),
    }
}

/// 256 cases per property (CI has 2 cores); `PROPTEST_CASES=N` runs longer sessions. The
/// compose client's properties use it too.
pub(crate) fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Field values that are valid, nearly valid or hostile.
fn field_value() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(serde_json::json!("gpu02")),
        Just(serde_json::json!(R2)),
        Just(serde_json::json!(
            "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml"
        )),
        Just(serde_json::json!("v0.0.452")),
        Just(serde_json::json!("prod/../etc/passwd")),
        Just(serde_json::json!("/prod/x.yaml")),
        Just(serde_json::json!([R1, R2])),
        Just(serde_json::json!("")),
        Just(serde_json::json!(null)),
        Just(serde_json::json!({"A": "b\nc"})),
        Just(serde_json::json!(["re:(", "ok"])),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        "\\PC{0,24}".prop_map(|s| serde_json::json!(s)),
    ]
}

/// A plan that `validate` accepts; `plan_object` mutates it so that the properties about
/// accepted plans see accepted plans (random objects are almost never valid).
fn valid_plan() -> serde_json::Value {
    serde_json::json!({
        "host": "gpu02",
        "file": "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml",
        "service": R2,
        "tag": "v0.0.452",
        "reason": "fuzz",
    })
}

/// A valid plan with up to four fields set to a valid, nearly valid or hostile value, or
/// removed.
fn plan_object() -> impl Strategy<Value = serde_json::Value> {
    let keys = prop_oneof![
        Just("host"),
        Just("file"),
        Just("service"),
        Just("tag"),
        Just("reason"),
        Just("runbook"),
        Just("env"),
        Just("require_logs"),
        Just("on_failure"),
        Just("bogus"),
    ];
    let change = (keys, proptest::option::of(field_value()));
    proptest::collection::vec(change, 0..5).prop_map(|changes| {
        let mut plan = valid_plan();
        let map = plan.as_object_mut().expect("an object");
        for (k, v) in changes {
            match v {
                Some(v) => map.insert(k.to_owned(), v),
                None => map.remove(k),
            };
        }
        plan
    })
}

#[test]
fn the_unmutated_plan_is_accepted_so_the_properties_see_accepted_plans() {
    let body = valid_plan().to_string();
    let spec = parse_json(body.as_bytes()).expect("parses");
    validate(spec, &known()).expect("accepted");
    let yaml = serde_yaml::to_string(&valid_plan()).expect("yaml");
    let spec = parse_yaml(&yaml).expect("parses as YAML");
    validate(spec, &known()).expect("accepted as YAML");
}

fn tag_ok(tag: &str) -> bool {
    !tag.is_empty()
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn plan_json_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(spec) = parse_json(&bytes) {
            let _ = validate(spec, &known());
        }
    }

    #[test]
    fn plan_yaml_text_never_panics(text in "\\PC{0,256}") {
        if let Ok(spec) = parse_yaml(&text) {
            let _ = validate(spec, &known());
        }
    }

    #[test]
    fn an_accepted_plan_names_a_configured_replica_a_safe_file_and_a_clean_tag(
        obj in plan_object()
    ) {
        let body = obj.to_string();
        let Ok(spec) = parse_json(body.as_bytes()) else { return Ok(()) };
        let Ok(plan) = validate(spec, &known()) else { return Ok(()) };
        prop_assert!(plan.host == "gpu02");
        prop_assert!(plan.service == R1 || plan.service == R2);
        prop_assert!(plan.file.starts_with("prod/") && !plan.file.contains(".."));
        prop_assert!(tag_ok(&plan.tag), "tag {:?}", plan.tag);
        prop_assert!(!plan.reason.trim().is_empty());
        for (k, v) in &plan.env {
            prop_assert!(!k.is_empty() && !v.contains('\n'));
        }
    }

    #[test]
    fn the_same_plan_reads_the_same_as_yaml_and_as_json(obj in plan_object()) {
        let json = parse_json(obj.to_string().as_bytes()).map(|s| validate(s, &known()));
        let yaml = serde_yaml::to_string(&obj)
            .map_err(|e| e.to_string())
            .and_then(|text| parse_yaml(&text).map_err(|e| e.to_string()))
            .map(|s| validate(s, &known()));
        if let (Ok(Ok(a)), Ok(Ok(b))) = (&json, &yaml) {
            prop_assert_eq!(a, b);
        }
    }

    #[test]
    fn runbook_text_never_panics(text in "\\PC{0,300}") {
        if let Ok(rb) = runbook::parse("fuzz", "fuzz.yaml", &text) {
            let _ = rb.ensure_safe();
        }
    }

    #[test]
    fn runbooks_of_known_step_shapes_never_panic(
        steps in proptest::collection::vec(step_line(), 0..8)
    ) {
        let text = format!("description: fuzz\nsteps:\n{}", steps.join(""));
        if let Ok(rb) = runbook::parse("fuzz", "fuzz.yaml", &text) {
            prop_assert_eq!(rb.steps.len(), steps.len());
            let _ = rb.ensure_safe();
        }
    }
}

fn duration() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0ms".to_owned()),
        Just("1h".to_owned()),
        Just("-5s".to_owned()),
        Just("99999999999999999999s".to_owned()),
        Just("5 s".to_owned()),
        (
            0u64..100_000,
            prop_oneof![Just("ms"), Just("s"), Just("m"), Just("h"), Just("d")]
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
    ]
}

fn step_line() -> impl Strategy<Value = String> {
    // Every registered kind, and one that is not.
    let mut kinds = runbook::StepKind::NAMES.to_vec();
    kinds.push("reboot");
    let kind = proptest::sample::select(kinds);
    (
        "[a-z][a-z-]{0,8}",
        kind,
        proptest::option::of(duration()),
        proptest::option::of(duration()),
        proptest::option::of(0u32..5),
        proptest::option::of(prop_oneof![Just("re:("), Just("CUDA error"), Just("")]),
    )
        .prop_map(|(name, kind, timeout, interval, n, pattern)| {
            let mut fields = vec![format!("name: {name}"), format!("kind: {kind}")];
            if let Some(t) = timeout {
                fields.push(format!("timeout: {t}"));
            }
            if let Some(i) = interval {
                fields.push(format!("interval: {i}"));
            }
            if let Some(n) = n {
                fields.push(format!("consecutive: {n}"));
            }
            if let Some(p) = pattern {
                fields.push(format!("forbid: [{p:?}]"));
            }
            format!("  - {{{}}}\n", fields.join(", "))
        })
}
