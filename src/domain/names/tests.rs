//! Each name's one rule, by table: what it accepts, what it refuses and why, and that serde
//! and `FromStr` apply the same rule.

use super::{ComposeFile, ServiceName, Tag};

#[test]
fn a_tag_keeps_gits_ref_rules_in_compose_managers_letters() {
    for good in ["v0.0.452", "release/2026-12", "v1_rc.2", "a"] {
        assert!(Tag::parse(good).is_ok(), "{good:?} was refused");
    }
    let long = "v".repeat(129);
    // (the tag, a word of why it is refused)
    let table = [
        ("", "must be a git tag"),
        (long.as_str(), "at most 128 bytes"),
        ("v1 && rm", "letters, digits"),
        ("v1;x", "letters, digits"),
        ("-v1", "start with `-`"),
        ("a//b", "`//`"),
        ("/v1", "`/`"),
        ("v1/", "`/`"),
        ("..", "`..`"),
        ("v1.", "end with `.`"),
        ("a/.b", "start with `.`"),
        ("x.lock", "`.lock`"),
        ("v%31", "letters, digits"),
    ];
    for (tag, why) in table {
        let err = Tag::parse(tag).expect_err(tag);
        assert!(err.why.contains(why), "{tag:?}: {err}");
        assert_eq!(err.what, "tag");
    }
}

#[test]
fn a_compose_file_is_a_relative_yaml_path_under_prod_in_no_spelling_of_dot_dot() {
    for good in [
        "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml",
        "prod/a/b.yml",
    ] {
        assert!(ComposeFile::parse(good).is_ok(), "{good:?} was refused");
    }
    let table = [
        ("", "such as prod/NAME.yaml"),
        ("/prod/x.yaml", "relative"),
        ("~/x.yaml", "relative"),
        ("prod/%2e%2e/evil.yaml", "percent-encoded"),
        ("prod/..\\evil.yaml", "backslashes"),
        ("prod/a\u{0}.yaml", "control characters"),
        ("prod/a b.yaml", "spaces"),
        ("prod/../evil.yaml", "`..`"),
        ("prod/a\u{ff0e}yaml", "letters, digits"),
        ("dev/a.yaml", "under prod/"),
        ("prod//a.yaml", "empty or `.`"),
        ("prod/./a.yaml", "empty or `.`"),
        ("prod/a.json", ".yaml or .yml"),
    ];
    for (file, why) in table {
        let err = ComposeFile::parse(file).expect_err(file);
        assert!(err.why.contains(why), "{file:?}: {err}");
        // Shown back escaped: a NUL or a backslash never reaches a message raw.
        assert!(
            err.shown.contains(&file.escape_debug().to_string()),
            "{err}"
        );
    }
}

#[test]
fn a_service_name_is_exactly_one_compose_service() {
    for good in ["nginx", "model-sg-glm53-w4afp8-tp4-r2", "a_b.c"] {
        assert!(ServiceName::parse(good).is_ok(), "{good:?} was refused");
    }
    for bad in [
        "", " ", "\t", "a,b", "a b", " a", "a\n", "[\"a\"]", "a;b", "r*",
    ] {
        assert!(ServiceName::parse(bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn serde_and_from_str_apply_the_same_rule_and_keep_the_string_as_it_is() {
    let tag: Tag = serde_json::from_str("\"v0.0.452\"").expect("a tag");
    assert_eq!(serde_json::to_string(&tag).expect("json"), "\"v0.0.452\"");
    assert_eq!(tag, "v0.0.452".parse::<Tag>().expect("a tag"));
    let err = serde_json::from_str::<Tag>("\"-v1\"").expect_err("refused");
    assert!(err.to_string().contains("must not start with `-`"), "{err}");
    assert!("prod/../x.yaml".parse::<ComposeFile>().is_err());
    assert!(serde_json::from_str::<ServiceName>("\"a,b\"").is_err());
}
