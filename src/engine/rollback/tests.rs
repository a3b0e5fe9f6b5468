//! The prior deployment a one-click rollback redeploys: never what already runs, and the
//! rollout it undoes (on a store of a temp SQLite file).

use std::collections::BTreeMap;

use chrono::{Duration, Utc};

use super::super::EngineError;
use super::{choose, Choice};
use crate::config::sim::{DEV_FILE, DEV_HOST, R2};
use crate::domain::state::{DeploymentSource, StepEvent};
use crate::store::tests::{steps, temp_store};
use crate::store::NewDeployment;

fn baseline(tag: &str) -> NewDeployment {
    NewDeployment {
        host: DEV_HOST.to_owned(),
        service: R2.parse().expect("a valid name"),
        file: DEV_FILE.parse().expect("a valid name"),
        tag: tag.parse().expect("a valid name"),
        env_overrides: BTreeMap::new(),
        env_sha256: None,
        commit: None,
        file_sha256: None,
        image: None,
        source: DeploymentSource::Baseline,
        rollout_id: None,
        deployed_at: Utc::now() - Duration::hours(1),
        deployed_as: None,
    }
}

fn no_prior(result: Result<Choice, EngineError>) -> String {
    match result {
        Err(e @ EngineError::NoPriorDeployment { .. }) => e.to_string(),
        Err(e) => panic!("another error: {e}"),
        Ok(c) => panic!("chose {:?}", c.target),
    }
}

#[tokio::test]
async fn a_rollback_chooses_the_newest_deployment_that_differs_from_what_runs() {
    let (_dir, store) = temp_store().await;
    let choose = |to_tag| choose(&store, DEV_HOST, R2, to_tag);

    let none = no_prior(choose(None).await);
    assert!(none.contains("none at all"), "{none}");

    // The baseline is what runs: nothing to go back to.
    store
        .record_baselines(&[baseline("v0.0.450")])
        .await
        .expect("baseline");
    let same = no_prior(choose(None).await);
    assert!(same.contains("is what it runs now"), "{same}");

    // The canary took r2 down: it now runs what the canary put there (or nothing), so the
    // baseline is the prior deployment and the canary the rollout undone.
    let mut canary = crate::store::tests::rollout("ro_1", DEV_HOST, R2, 0);
    canary.file = DEV_FILE.parse().expect("a valid name");
    canary.tag = "v0.0.452".parse().expect("a valid name");
    canary.created_at = Utc::now();
    store
        .create_rollout(&canary, &steps())
        .await
        .expect("rollout");
    let down = store.steps("ro_1").await.expect("steps").remove(1);
    store
        .transition_step(
            &down,
            StepEvent::Start,
            &serde_json::json!({}),
            None,
            Utc::now(),
        )
        .await
        .expect("down started");
    store
        .begin_attempt(&down, "compose/down", Utc::now(), true)
        .await
        .expect("the down's attempt");
    let choice = choose(None).await.expect("a prior deployment");
    assert_eq!(choice.target.tag, "v0.0.450");
    assert_eq!(choice.undoes.as_deref(), Some("ro_1"));

    // Asked for the canary's own tag: never what runs.
    let own = no_prior(choose(Some("v0.0.452")).await);
    assert!(own.contains("with tag v0.0.452"), "{own}");
}
