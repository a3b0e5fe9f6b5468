//! `free_space`: the weights pre-stage's gate decides from `/version` and `/host/cache` alone,
//! sending nothing: already cached, enough room, too little, a volume the host does not
//! report, no model cache configured, a file the host does not run.

use super::{ended, message, Bench, FILE};
use crate::compose::{CacheVolume, HostCache, VersionInfo};
use crate::config::ModelCache;

const GIB: u64 = 1 << 30;
/// (case, configured cache, deployed file, volumes, cached repos, status, code, a word).
type Case = (
    &'static str,
    bool,
    &'static str,
    Vec<CacheVolume>,
    Vec<&'static str>,
    &'static str,
    Option<&'static str>,
    &'static str,
);

const STEP: &str = "  - {name: space, kind: free_space, weights: org/model, required: 250GiB}\n";

#[tokio::test]
async fn the_gate_decides_from_the_hosts_cache_and_file_and_sends_nothing() {
    let volume = |used: u64| CacheVolume {
        name: "hf".to_owned(),
        size_bytes: used * GIB,
    };
    let table: [Case; 6] = [
        (
            "enough",
            true,
            FILE,
            vec![volume(180)],
            vec![],
            "succeeded",
            None,
            "",
        ),
        (
            "too little",
            true,
            FILE,
            vec![volume(900)],
            vec![],
            "failed",
            Some("insufficient_space"),
            "124.0 GiB free",
        ),
        (
            "cached",
            true,
            FILE,
            vec![volume(900)],
            vec!["models--org--model"],
            "succeeded",
            None,
            "",
        ),
        (
            "no such volume",
            true,
            FILE,
            vec![],
            vec![],
            "failed",
            Some("model_cache_unknown"),
            "does not report",
        ),
        (
            "no config",
            false,
            FILE,
            vec![volume(10)],
            vec![],
            "failed",
            Some("model_cache_unknown"),
            "model_cache",
        ),
        (
            "another file",
            true,
            "prod/other.yaml",
            vec![volume(10)],
            vec![],
            "failed",
            Some("file_not_deployed"),
            "orphans",
        ),
    ];
    for (case, configured, deployed, volumes, weights, status, code, word) in table {
        let mut bench = Bench::new(STEP);
        bench.config.model_cache = configured.then(|| ModelCache {
            volume: "hf".to_owned(),
            capacity: 1024 * GIB,
        });
        *bench.host.version.lock().expect("version") = VersionInfo {
            file: Some(deployed.to_owned()),
            ..VersionInfo::default()
        };
        *bench.host.cache.lock().expect("cache") = HostCache {
            volumes,
            weights: weights.iter().map(|w| w.to_string()).collect(),
        };
        let end = bench.run(0, None).await;
        let (got, got_code, detail) = ended(&end);
        assert_eq!(
            (got, got_code.as_deref()),
            (status, code),
            "{case}: {detail}"
        );
        assert!(message(&end).contains(word), "{case}: {}", message(&end));
        if code.is_some() {
            assert!(
                message(&end).contains("nothing sent"),
                "{case}: {}",
                message(&end)
            );
        }
        assert_eq!(
            detail["already_staged"] == true,
            case == "cached",
            "{case}: {detail}"
        );
        assert!(
            bench.host.compose_calls().is_empty(),
            "{case}: nothing sent"
        );
    }
}
