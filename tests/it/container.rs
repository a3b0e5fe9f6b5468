//! The container image as documented: no Docker engine runs here, so the Dockerfile and the
//! container config are read and held against each other (the documented `docker run` mounts
//! `config/` at /etc/canaryd), and `canaryd healthcheck`, the image's HEALTHCHECK, runs for real.

use std::path::Path;
use std::process::Command;

use crate::helpers::TestApp;

fn repo_file(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The Dockerfile's instructions, continuation lines joined, comments dropped.
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        current.push_str(trimmed.trim_end_matches('\\'));
        current.push(' ');
        if !trimmed.ends_with('\\') {
            out.push(current.trim().to_owned());
            current.clear();
        }
    }
    out
}

/// The run stage's instructions (after the last `FROM`).
fn run_stage(dockerfile: &str) -> Vec<String> {
    let all = instructions(dockerfile);
    let last_from = all
        .iter()
        .rposition(|i| i.starts_with("FROM "))
        .expect("a FROM");
    all[last_from..].to_vec()
}

fn yaml_str<'a>(doc: &'a serde_yaml::Value, key: &str) -> &'a str {
    doc[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} in the container config"))
}

#[test]
fn the_documented_docker_run_finds_config_runbooks_and_database_where_the_image_puts_them() {
    let dockerfile = repo_file("Dockerfile");
    let stage = run_stage(&dockerfile);
    let find = |prefix: &str| {
        stage
            .iter()
            .find(|i| i.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in the run stage: {stage:#?}"))
            .clone()
    };
    // The documented command mounts config/ at /etc/canaryd and names the container config.
    assert!(
        dockerfile.contains(r#"-v "$PWD/config:/etc/canaryd:ro""#),
        "the documented run mounts config/"
    );
    let config_name = "canaryd.container.yaml";
    assert!(dockerfile.contains(&format!("--config /etc/canaryd/{config_name}")));
    let text = repo_file(&format!("config/{config_name}"));
    let config: serde_yaml::Value = serde_yaml::from_str(&text).expect("YAML");

    // Every secret the config names is passed with -e in the documented command.
    let mut vars: Vec<String> = Vec::new();
    for line in text.lines() {
        if let Some((_, rest)) = line.split_once("token_env: ") {
            let var: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            vars.push(var);
        }
    }
    assert!(vars.len() >= 4, "{vars:?}");
    for var in &vars {
        assert!(
            dockerfile.contains(&format!("-e {var}=")),
            "the documented run passes {var}"
        );
    }

    // Runbooks: copied into the image outside the config mount, where the config looks.
    let runbooks_dir = yaml_str(&config, "runbooks_dir");
    assert!(
        !runbooks_dir.starts_with("/etc/canaryd"),
        "not under the config mount"
    );
    assert_eq!(
        find("COPY runbooks"),
        format!("COPY runbooks {runbooks_dir}")
    );

    // The database: inside a volume the image's user owns.
    let database = yaml_str(&config, "database");
    let data_dir = Path::new(database)
        .parent()
        .expect("a folder")
        .to_str()
        .expect("utf-8");
    let volume = find("VOLUME");
    assert!(volume.contains(&format!("\"{data_dir}\"")), "{volume}");
    let user = find("USER ");
    let uid = user
        .trim_start_matches("USER ")
        .split(':')
        .next()
        .expect("uid");
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u >= 10000),
        "a numeric non-root user: {user}"
    );
    assert!(
        find("RUN apt-get").contains(&format!("chown {uid}:{uid} {data_dir}")),
        "the database folder belongs to the user"
    );

    // Listening: on every interface of the container, on the exposed port the healthcheck probes.
    let listen = yaml_str(&config, "listen");
    let port = listen.rsplit(':').next().expect("port");
    assert!(listen.starts_with("0.0.0.0:"), "{listen}");
    assert_eq!(find("EXPOSE"), format!("EXPOSE {port}"));
    let healthcheck = find("HEALTHCHECK");
    assert!(
        healthcheck.contains(r#""/usr/local/bin/canaryd", "healthcheck""#)
            && healthcheck.contains(&format!("127.0.0.1:{port}/healthz")),
        "{healthcheck}"
    );

    // And the container config loads (its runbooks read from the repo, not the image).
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("env")).expect("env dir");
    std::fs::write(
        dir.path().join("env/gpu02.env"),
        repo_file("config/env/gpu02.env"),
    )
    .expect("env file");
    let repo_runbooks = Path::new(env!("CARGO_MANIFEST_DIR")).join("runbooks");
    let local = text.replace(runbooks_dir, repo_runbooks.to_str().expect("utf-8"));
    let path = dir.path().join(config_name);
    std::fs::write(&path, local).expect("config copy");
    let loaded = canaryd::config::load_with_env(&path, &|var| Some(format!("secret-{var}")))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.check_listen_safety(), Ok(()));
}

#[test]
fn the_dockerfile_is_hadolint_clean_when_hadolint_is_installed() {
    let Ok(out) = Command::new("hadolint")
        .arg("Dockerfile")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
    else {
        eprintln!("hadolint is not installed here; .ci/run installs and runs it");
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

fn healthcheck(url: &str) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_canaryd"))
        .args(["healthcheck", "--url", url, "--timeout-secs", "3"])
        .output()
        .expect("the binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[tokio::test]
async fn healthcheck_exits_zero_against_a_running_daemon_and_one_against_a_closed_port() {
    let app = TestApp::spawn().await;
    let url = format!("{}/healthz", app.url);
    let (code, text) = tokio::task::spawn_blocking(move || healthcheck(&url))
        .await
        .expect("join");
    assert_eq!(code, Some(0), "{text}");
    let missing = format!("{}/no-such-route", app.url);
    let (code, text) = tokio::task::spawn_blocking(move || healthcheck(&missing))
        .await
        .expect("join");
    assert_eq!(code, Some(1), "a 404 is not healthy: {text}");
    app.stop().await;

    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let (code, text) = tokio::task::spawn_blocking(move || {
        healthcheck(&format!("http://127.0.0.1:{port}/healthz"))
    })
    .await
    .expect("join");
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("did not answer"), "{text}");
}
