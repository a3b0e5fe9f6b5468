use super::{cache_dir, format_size, parse_size, verdict, SpaceVerdict};

const GIB: u64 = 1 << 30;
const VOLUME: &str = "work_huggingface_cache";
const REPO: &str = "zai-org/GLM-5.3-W4AFP8";

#[test]
fn a_repo_is_cached_under_its_hugging_face_directory_name() {
    assert_eq!(cache_dir(REPO), "models--zai-org--GLM-5.3-W4AFP8");
    assert_eq!(cache_dir("single"), "models--single");
}

/// (case, volumes and their used bytes, cached repos, capacity, required, verdict).
type Case<'a> = (
    &'static str,
    Vec<(String, u64)>,
    &'a Vec<String>,
    u64,
    u64,
    SpaceVerdict,
);

#[test]
fn the_gate_stages_only_into_enough_free_space_and_not_at_all_when_cached() {
    let cached = vec![cache_dir(REPO)];
    let other = vec![cache_dir("zai-org/GLM-5.3-Flash")];
    let used = |bytes: u64| vec![(VOLUME.to_owned(), bytes)];
    let cases: Vec<Case<'_>> = vec![
        (
            "already cached: nothing to download, whatever the space",
            used(990 * GIB),
            &cached,
            1000 * GIB,
            250 * GIB,
            SpaceVerdict::AlreadyStaged,
        ),
        (
            "room for the ~165 GiB snapshot behind a 250 GiB requirement",
            used(500 * GIB),
            &other,
            1000 * GIB,
            250 * GIB,
            SpaceVerdict::Enough { free: 500 * GIB },
        ),
        (
            "exactly the required space is enough",
            used(750 * GIB),
            &other,
            1000 * GIB,
            250 * GIB,
            SpaceVerdict::Enough { free: 250 * GIB },
        ),
        (
            "one byte short",
            used(750 * GIB + 1),
            &other,
            1000 * GIB,
            250 * GIB,
            SpaceVerdict::Insufficient {
                free: 250 * GIB - 1,
                required: 250 * GIB,
            },
        ),
        (
            "a volume over its configured capacity has nothing free",
            used(1200 * GIB),
            &other,
            1000 * GIB,
            250 * GIB,
            SpaceVerdict::Insufficient {
                free: 0,
                required: 250 * GIB,
            },
        ),
        (
            "the host does not report the configured volume",
            vec![("work_other".to_owned(), GIB)],
            &other,
            1000 * GIB,
            250 * GIB,
            SpaceVerdict::VolumeMissing,
        ),
    ];
    for (case, volumes, weights, capacity, required, want) in cases {
        let got = verdict(&volumes, weights, VOLUME, capacity, required, REPO);
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn sizes_are_a_whole_number_and_a_binary_unit() {
    for (text, bytes) in [
        ("250GiB", 250 * GIB),
        ("1TiB", 1 << 40),
        ("512MiB", 512 << 20),
        ("0B", 0),
    ] {
        assert_eq!(parse_size(text), Ok(bytes), "{text}");
    }
    for bad in ["250", "250GB", "2.5GiB", "-1GiB", "GiB", "99999999999TiB"] {
        let err = parse_size(bad).expect_err(bad);
        assert!(err.contains("is not a size"), "{bad}: {err}");
    }
    assert_eq!(format_size(165 * GIB), "165.0 GiB");
    assert_eq!(format_size(1536 << 20), "1.5 GiB");
    assert_eq!(format_size(12), "12 B");
}
