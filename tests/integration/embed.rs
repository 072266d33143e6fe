//! The embedding API: the example program runs, and the engine lives under an application's
//! own ractor supervisor.

use crate::common::*;
use ft_actor::engine::{Engine, EngineConfig, EngineRequest};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use std::sync::{Arc, Mutex};

#[test]
fn the_embed_example_builds_and_runs() {
    // Integration tests live in target/<profile>/deps; examples in target/<profile>/examples.
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("examples").join("embed");
    assert!(path.exists(), "cargo test builds examples; missing {}", path.display());
    let out = std::process::Command::new(&path)
        .arg(fixture("qwen3_moe").join("checkpoint"))
        .env("XDG_CACHE_HOME", std::env::temp_dir().join("ft-actor-test-cache"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("hit rate"), "{stdout}");
}

struct Supervisor;

impl Actor for Supervisor {
    type Msg = ();
    type State = Arc<Mutex<Vec<String>>>;
    type Arguments = Arc<Mutex<Vec<String>>>;

    async fn pre_start(&self, _me: ActorRef<()>, log: Self::Arguments) -> Result<Self::State, ActorProcessingErr> {
        Ok(log)
    }

    async fn handle_supervisor_evt(&self, _me: ActorRef<()>, ev: SupervisionEvent, log: &mut Self::State) -> Result<(), ActorProcessingErr> {
        if let Ok(mut l) = log.lock() {
            l.push(match ev {
                SupervisionEvent::ActorTerminated(..) => "terminated".into(),
                SupervisionEvent::ActorFailed(..) => "failed".into(),
                _ => "other".into(),
            });
        }
        Ok(())
    }
}

#[test]
fn the_engine_runs_under_an_application_supervisor() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let log = Arc::new(Mutex::new(vec![]));
        let (sup, _) = Actor::spawn(None, Supervisor, log.clone()).await.unwrap();
        let config = EngineConfig { model: Some(fixture("mixtral").join("checkpoint")), cpu_threads: Some(2), ..Default::default() };
        let engine = Engine::spawn(config, Some(sup.get_cell())).await.unwrap();
        let (ids, _, _) = engine.generate(EngineRequest::greedy(vec![1, 2, 3], 4)).await.unwrap().collect().await.unwrap();
        assert!(!ids.is_empty());
        engine.shutdown().await;
        for _ in 0..50 {
            if log.lock().unwrap().iter().any(|e| e == "terminated") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let events = log.lock().unwrap().clone();
        assert!(events.iter().any(|e| e == "terminated"), "the supervisor saw the engine stop: {events:?}");
        sup.stop(None);
    });
}
